"""benchmarks/report.py on a small synthetic run (CPU only): the numbers it picks and computes,
the GPU label, and (with matplotlib installed) the PNGs and the markdown page."""
import importlib.util
import json
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
spec = importlib.util.spec_from_file_location("bench_report", BENCH_DIR / "report.py")
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)

SIZES = ("4K", "8K", "32K", "128K")
CTX = ("8K", "32K")


def synthetic_run(gpu="NVIDIA A100-SXM4-80GB", dense_decode=True):
    """A bench_msa.py --out file: times chosen so that every speedup is a known ratio."""
    rows = []

    def row(stage, case, us, status="ok"):
        rows.append(dict(stage=stage, case=case, status=status, median_us=us, notes=""))
    for i, s in enumerate(SIZES):
        scale = 4 ** i
        row("proxy", f"prefill S={s} idx 4q/1k", 300.0 * scale)
        row("proxy", f"prefill S={s} idx 4q/1k sm90", 200.0 * scale)  # the faster variant
        row("proxy", f"prefill S={s} idx 4q/1k sm90_ss", 0.0, status="skip")
        row("topk", f"prefill S={s} H4 P=1", 50.0 * scale)
        row("topk", f"prefill S={s} H4 P=1 [new]", 1.0)  # forced kernel: not plotted
        row("sparse", f"S={s} bf16 flat pipeline", 1000.0 * scale)
        row("sparse", f"S={s} bf16 flat pipeline [kv_major]", 1.0)
        row("sparse", f"S={s} fp8 flat pipeline", 1.0)
        row("pipeline", f"S={s} 64q/4kv/4idx bf16 flat", 1250.0 * scale)
        row("dense", f"S={s} SDPA causal 64 heads", 2500.0 * scale * (i + 1))
        row("pipeline", f"S={s} TP4 16q/1kv/1idx bf16 flat", 500.0 * scale)
        row("dense", f"S={s} SDPA causal 16 heads", 1000.0 * scale)
    for b in (1, 64):
        for j, c in enumerate(CTX):
            row("index", f"decode B{b} ctx={c} sq1 +topk", 20.0 * b * (j + 1))
            row("index", f"decode B{b} ctx={c} sq4 +topk", 1.0)
            row("decode", f"B{b} ctx={c} sq1 bf16 paged", 10.0 * b)
            row("decode", f"B{b} ctx={c} sq1 fp8 paged", 1.0)
            if dense_decode:
                row("dense", f"decode B{b} ctx={c} sq1 SDPA 64 heads", 90.0 * b * (j + 1))
    meta = dict(gpu=gpu, commit="abc1234", date="2026-12-01T12:00:00+00:00", mode="full",
                argv=["benchmarks/bench_msa.py", "--out", "x.json"])
    return dict(meta=meta, ceilings=dict(matmul_tflops=300.0, copy_gbs=1500.0), rows=rows)


def write(tmp_path, data, name="run.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_collect_and_speedups(tmp_path):
    run = report.load_run(write(tmp_path, synthetic_run()))
    data = report.collect(run)
    pre = data["prefill"]
    assert sorted(pre["proxy"]) == [4096, 8192, 32768, 131072]
    # The fastest proxy variant that ran; skipped rows and forced schedules are not plotted.
    assert pre["proxy"][8192] == (800.0, "prefill S=8K idx 4q/1k sm90")
    assert pre["topk"][4096][0] == 50.0 and pre["sparse"][131072][0] == 1000.0 * 64
    sp = report.speedups(data)
    for i, s in enumerate((4096, 8192, 32768, 131072)):
        assert sp["prefill"]["pipeline"][s] == pytest.approx(2.0 * (i + 1))
        assert sp["prefill"]["sparse"][s] == pytest.approx(2.5 * (i + 1))
        assert sp["prefill"]["pipeline_tp4"][s] == pytest.approx(2.0)
    # decode: dense / (index + attention) = 90 (j+1) / (20 (j+1) + 10)
    assert sp["decode"][64][8192] == pytest.approx(90 / 30)
    assert sp["decode"][1][32768] == pytest.approx(180 / 50)
    assert data["decode"]["attention"][(64, 32768)] == (640.0, "B64 ctx=32K sq1 bf16 paged")


def test_recorded_layout_and_gpu_label(tmp_path):
    data = synthetic_run(gpu="NVIDIA H200 (driver 1.0)")
    meta = data.pop("meta")
    recorded = dict(commit="def5678", date="2026-11-29", gpu=meta["gpu"], title="a change",
                    scope="full table", commands=["python benchmarks/bench_msa.py"],
                    ceilings=data["ceilings"],
                    rows=[{k: v for k, v in r.items() if k != "status"} for r in data["rows"]
                          if r["status"] == "ok"]
                    + [dict(stage="sparse", case="S=64K bf16 flat pipeline", ms=7.5,
                            from_text=True)])
    run = report.load_run(write(tmp_path, recorded))
    assert run["meta"]["commit"] == "def5678" and run["meta"]["mode"] == "full table"
    assert report.gpu_label(run["meta"]) == "NVIDIA H200 (driver 1.0)"
    assert report.collect(run)["prefill"]["sparse"][65536][0] == 7500.0  # quoted in ms
    other = report.load_run(write(tmp_path, synthetic_run(), "other.json"))
    assert report.gpu_label(other["meta"]) == "NVIDIA A100-SXM4-80GB (not the H200)"


def test_not_a_result(tmp_path):
    with pytest.raises(ValueError, match="rows"):
        report.load_run(write(tmp_path, {"meta": {}}))
    assert report.main([str(write(tmp_path, [1, 2], "bad.json")), "--out",
                        str(tmp_path / "r")]) == 2


@pytest.mark.parametrize("dense_decode", [True, False])
def test_report_files(tmp_path, dense_decode):
    pytest.importorskip("matplotlib")
    out = tmp_path / "report"
    src = write(tmp_path, synthetic_run(dense_decode=dense_decode))
    assert report.main([str(src), "--out", str(out)]) == 0
    pngs = {p.name for p in out.glob("*.png")}
    expected = {"prefill_time.png", "prefill_speedup.png", "decode_time.png"}
    assert pngs == expected | ({"decode_speedup.png"} if dense_decode else set())
    for name in pngs:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "README.md").read_text()
    assert "NVIDIA A100-SXM4-80GB (not the H200)" in md.splitlines()[0]
    assert "**Measured on NVIDIA A100-SXM4-80GB**" in md and "commit abc1234" in md
    for name in pngs:
        assert f"]({name})" in md
    # 32K prefill row: pipeline 1250*16 us = 20.00 ms, dense 2500*16*3 us = 120.00 ms -> 6.00x
    assert "| 32K | 3.20 | 0.80 | 16.00 | 20.00 | 120.00 | 6.00x |" in md
    if dense_decode:
        assert "| 64 | 32K | 2560.0 | 640.0 | 3200.0 | 11520.0 | 3.60x |" in md
    else:
        assert "no dense decode rows" in md
        assert "| 64 | 32K | 2560.0 | 640.0 | 3200.0 |  |  |" in md


def test_newest_numbers_of_several_runs_keep_each_speedup_within_one_run(tmp_path):
    """Several runs: each number is the newest run's, but a pipeline time and the dense time it is
    divided by come from one run (the newest with both), as do a decode row's times."""
    old = synthetic_run(gpu="NVIDIA H200")
    new = dict(meta=dict(old["meta"], commit="fff0000", date="2026-12-02T08:00:00+00:00"),
               ceilings=old["ceilings"], rows=[
                   dict(stage="proxy", case="prefill S=8K idx 4q/1k", median_us=111.0),
                   dict(stage="pipeline", case="S=8K 64q/4kv/4idx bf16 flat", median_us=10.0),
                   dict(stage="pipeline", case="S=32K 64q/4kv/4idx bf16 flat", median_us=1000.0),
                   dict(stage="dense", case="S=32K SDPA causal 64 heads", median_us=5000.0),
                   dict(stage="sparse", case="S=32K bf16 flat pipeline", median_us=500.0),
                   dict(stage="decode", case="B64 ctx=8K sq1 bf16 paged", median_us=1.0)])
    runs = [report.load_run(write(tmp_path, old, "old.json")),
            report.load_run(write(tmp_path, new, "new.json"))]
    data, origin, sparse_dense = report.collect_latest(runs)
    pre = data["prefill"]
    assert pre["proxy"][8192] == (111.0, "prefill S=8K idx 4q/1k") and origin["prefill"]["proxy"][8192] == 1
    # 8K: the new run has no dense time, so pipeline and dense both come from the old run.
    assert pre["pipeline"][8192][0] == 1250.0 * 4 and origin["prefill"]["pipeline"][8192] == 0
    assert origin["prefill"]["dense"][8192] == 0
    # 32K: the new run has both.
    assert pre["pipeline"][32768][0] == 1000.0 and pre["dense"][32768][0] == 5000.0
    sp = report.speedups(data, sparse_dense)
    assert sp["prefill"]["pipeline"][32768] == pytest.approx(5.0)
    assert sp["prefill"]["sparse"][32768] == pytest.approx(10.0)  # the new run's dense
    # The new run's decode row has no index time: the whole row stays the old run's.
    assert data["decode"]["attention"][(64, 8192)][0] == 640.0
    assert origin["decode"]["dense"][(64, 8192)] == 0


def test_report_of_several_runs(tmp_path):
    pytest.importorskip("matplotlib")
    old = synthetic_run(gpu="NVIDIA H200")
    new = dict(meta=dict(old["meta"], commit="fff0000", date="2026-12-02T08:00:00+00:00"),
               ceilings=old["ceilings"], rows=[
                   dict(stage="pipeline", case="S=32K 64q/4kv/4idx bf16 flat", median_us=1000.0),
                   dict(stage="dense", case="S=32K SDPA causal 64 heads", median_us=5000.0)])
    files = [str(write(tmp_path, old, "old.json")), str(write(tmp_path, new, "new.json"))]
    out = tmp_path / "report"
    assert report.main(files + ["--out", str(out)]) == 0
    md = (out / "README.md").read_text()
    assert "commit fff0000 and 1 earlier run," in md and "* `new.json`: commit fff0000" in md
    assert "| 32K | 3.20 | 0.80 | 16.00 | 1.00 | 5.00 | 5.00x |" in md
    assert md.count("fff0000, abc1234 |") == 1  # the 32K row's runs
    # --since keeps the newer run only; a malformed date and runs of two GPUs are refused.
    assert report.main(files + ["--since", "2026-12-02", "--out", str(tmp_path / "r2")]) == 0
    assert "abc1234" not in (tmp_path / "r2" / "README.md").read_text()
    assert report.main(files + ["--since", "Dec 2", "--out", str(tmp_path / "r3")]) == 2
    assert report.main(files + ["--since", "2027-01-01", "--out", str(tmp_path / "r3")]) == 2
    other = synthetic_run()  # an A100 run
    assert report.main(files + [str(write(tmp_path, other, "a100.json")), "--out", str(tmp_path / "r4")]) == 2
    # A superseded run (a recorded result naming the commit that replaced what it measured) is
    # left out of a report of several runs, and named.
    rec = dict(commit="eee0000", date="2026-12-03", gpu="NVIDIA H200", title="t", scope="s",
               commands=["c"], ceilings=old["ceilings"], superseded="fff1111: the kernel changed",
               rows=[dict(stage="pipeline", case="S=32K 64q/4kv/4idx bf16 flat", median_us=7.0),
                     dict(stage="dense", case="S=32K SDPA causal 64 heads", median_us=5000.0)])
    files3 = files + [str(write(tmp_path, rec, "sup.json"))]
    assert report.main(files3 + ["--out", str(tmp_path / "r5")]) == 0
    md = (tmp_path / "r5" / "README.md").read_text()
    assert "| 32K | 3.20 | 0.80 | 16.00 | 1.00 | 5.00 | 5.00x |" in md
    assert "Left out (superseded): `sup.json` (commit eee0000: fff1111: the kernel changed)" in md
    assert "eee0000 |" not in md
