"""benchmarks/sanitize_smoke.py's hostile-input calls, run on the CPU reference: every call is a
valid one (the ops accept it and clamp or ignore the hostile values), so that under
compute-sanitizer on the GPU a failure means a kernel's fault, not a rejected argument. And the
selection of cases (--list, --shard, --only): shards partition the cases, a case's data do not
depend on which other cases run, unselected cases build nothing. All on the CPU: ``cpu_only``
(conftest.py); on the GPU the smoke calls run in gpu_check's sanitizer step."""

import hashlib
import sys
from pathlib import Path

import pytest
import torch

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import sanitize_smoke  # noqa: E402
from conftest import cpu_only  # noqa: E402
from flashmsa import msa_ops  # noqa: E402

pytestmark = cpu_only


def test_hostile_calls_run_on_the_cpu_reference(capsys):
    smoke = sanitize_smoke.Smoke(msa_ops, torch.device("cpu"))
    smoke.hostile()
    out = capsys.readouterr().out
    assert smoke.failed == [], out
    assert smoke.skipped == []
    assert len(smoke.passed) >= 60
    names = " ".join(smoke.passed)
    for what in ("invalid page ids", "out-of-range ids", "every selection empty", "nvp all 0",
                 "no query rows", "zero-length sequences", "empty page table",
                 "lengths beyond the table", "every sequence empty", "batch 0"):
        assert what in names, what
    for schedule in ("query_major", "kv_major", "hybrid"):
        assert f"hostile sparse [{schedule}]" in names
    assert smoke.passed == sorted(set(smoke.passed), key=smoke.passed.index)  # names are unique


# ---- case selection: --list, --shard, --only ---------------------------------------------------

def listed(only=None, shard=None):
    smoke = sanitize_smoke.Smoke(msa_ops, torch.device("cpu"), only, shard, listing=True)
    smoke.run_parts()
    return smoke.listed


def test_list_needs_no_device_and_names_are_unique(capsys):
    assert sanitize_smoke.main(["--list"]) == 0
    names = capsys.readouterr().out.splitlines()
    assert len(names) >= 300
    assert len(set(names)) == len(names)
    assert names == listed()
    assert any(n.startswith("hostile ") for n in names) and "pipeline M3 decode step B8" in names


@pytest.mark.parametrize("only,n", [(None, 8), (None, 3), ("hostile", 8),
                                    ("hybrid|proxy decode", 5)])
def test_shards_partition_the_selected_cases(only, n):
    full = listed(only)
    assert full
    shards = [listed(only, (i, n)) for i in range(1, n + 1)]
    for i, shard in enumerate(shards, 1):
        assert shard == full[i - 1::n]  # every n-th from the i-th, in case order
    assert sorted(sum(shards, [])) == sorted(full)  # union: every case once (disjoint)


def test_shard_summary_line(capsys):
    assert sanitize_smoke.main(["--list", "--only", "hostile", "--shard", "2/8"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 12
    assert "shard 2/8 (12 of 91 calls)" in err and "not matching --only 'hostile'" in err
    with pytest.raises(SystemExit):
        sanitize_smoke.main(["--list", "--shard", "9/8"])


def test_resume_leaves_out_what_an_earlier_run_passed_or_skipped(tmp_path, capsys):
    full = listed("hostile")
    # An earlier run's merged log: shard headers and sanitizer lines around the results; a FAIL
    # and a case cut before its result line run again.
    log = tmp_path / "racecheck.log"
    log.write_text("\n".join([
        "##### shard 1/2: exit 124, 531s",
        "===== compute-sanitizer --tool racecheck ...",
        f"PASS {full[0]} (9.4 s)",
        f"SKIP {full[1]}: NotImplementedError: not on this device",
        f"FAIL {full[2]}: RuntimeError: output contains NaN",
        "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)",
        f"PASS {full[3]} (0.2 s)",
        f"PASS not a case of this run (1.0 s)",
    ]) + "\n")
    done = sanitize_smoke.finished_cases(str(log))
    assert done == {full[0], full[1], full[3], "not a case of this run"}
    rest = [n for n in full if n not in done]
    smoke = sanitize_smoke.Smoke(msa_ops, torch.device("cpu"), "hostile", (2, 3), listing=True,
                                 done=done)
    smoke.run_parts()
    assert smoke.listed == rest[1::3]  # the shard splits what is left
    assert smoke.resumed == 3 and smoke.matched == len(rest)
    capsys.readouterr()
    assert sanitize_smoke.main(["--list", "--only", "hostile", "--resume", str(log)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == rest
    assert f"3 done in {log}" in err
    # Everything done: nothing to run, and that is not "no case matches --only".
    log.write_text("".join(f"PASS {n} (0.1 s)\n" for n in full))
    assert sanitize_smoke.main(["--list", "--only", "hostile", "--resume", str(log)]) == 0
    with pytest.raises(SystemExit, match="--resume"):
        sanitize_smoke.main(["--list", "--resume", str(tmp_path / "missing.log")])


class RecordingOps:
    """Any op (public or planned twin): records a digest of its arguments under the running case."""

    def __init__(self):
        self.case, self.calls = None, {}

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def op(*args, **kwargs):
            self.calls.setdefault(self.case, []).append((name, digest(args), digest(kwargs)))
        return op


def digest(x):
    if isinstance(x, torch.Tensor):
        data = x.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
        return (str(x.dtype), tuple(x.shape), hashlib.sha1(data).hexdigest())
    if isinstance(x, (list, tuple)):
        return tuple(digest(v) for v in x)
    if isinstance(x, dict):  # output=: torch.empty, its contents are not data
        return tuple(sorted((k, digest(v) if k != "output" else (str(v.dtype), tuple(v.shape)))
                            for k, v in x.items()))
    return repr(x)


class RecordingSmoke(sanitize_smoke.Smoke):
    def _call(self, name, fn):
        self.ops.case = name
        super()._call(name, fn)


PARTS = ("proxy", "proxy_decode", "topk", "hostile")  # the cheap ones to build on the CPU


def recorded(only=None, shard=None):
    smoke = RecordingSmoke(RecordingOps(), torch.device("cpu"), only, shard)
    smoke.run_parts(PARTS)
    assert smoke.failed == []
    return smoke.ops.calls


def test_a_case_gets_the_same_data_in_a_shard_or_alone(capsys):
    full = recorded()
    assert len(full) >= 100
    shard = recorded(shard=(2, 3))
    assert shard and set(shard) < set(full)
    for name, calls in shard.items():
        assert calls == full[name], name
    # Alone, after cases that draw their own data and before ones that share theirs.
    for name in ("hostile sparse [kv_major] paged float8_e4m3fn lengths beyond the table",
                 "proxy decode paged bfloat16 k, G2, sq4",
                 "topk [radix] H3 P200 S77 k64 per-token nvp fb2 fe1"):
        alone = recorded(only=name)
        assert list(alone) == [name]
        assert alone[name] == full[name], name


def test_unselected_cases_build_nothing(monkeypatch):
    built = []
    for helper in ("rnd", "paged", "selection", "decode_selection"):
        original = getattr(sanitize_smoke.Smoke, helper)

        def counting(self, *args, original=original, helper=helper, **kwargs):
            built.append(helper)
            return original(self, *args, **kwargs)
        monkeypatch.setattr(sanitize_smoke.Smoke, helper, counting)
    assert len(listed()) >= 300
    assert built == []
    recorded(only="hostile proxy flat no query rows")
    assert built == ["rnd", "rnd"]  # its own q and k, none of the shared inputs


# ---- --no-tma-stores (initcheck) ----------------------------------------------------------------

class PlannedTwinOps:
    """Stands in for msa_ops: each planned twin returns its options."""

    def _sparse_attention_planned(self, *args, options, **kwargs):
        return ("attention", options)

    def _sparse_decode_planned(self, *args, options, **kwargs):
        return ("decode", options)


def test_no_tma_stores_plans_stg_under_every_tag_and_skips_the_tma_kernel():
    ops = sanitize_smoke.no_tma_stores(PlannedTwinOps())
    planned = sanitize_smoke.PlannedOps
    assert ops.msa_sparse_attention() == ("attention", {"kv_major_store": "stg"})
    tag = planned(ops, msa_sparse_attention=dict(schedule="kv_major", chunk_rows=100))
    assert tag.msa_sparse_attention() == (
        "attention", {"kv_major_store": "stg", "schedule": "kv_major", "chunk_rows": 100})
    # Options of another op keep the attention's.
    decode = planned(ops, msa_sparse_decode_attention=dict(kernel="regs"))
    assert decode.msa_sparse_decode_attention() == ("decode", {"kernel": "regs"})
    assert decode.msa_sparse_attention() == ("attention", {"kv_major_store": "stg"})
    for options in (dict(schedule="kv_major", kv_major_kernel="tma"), dict(kv_major_store="tma")):
        with pytest.raises(NotImplementedError, match="--no-tma-stores: initcheck does not see"):
            planned(ops, msa_sparse_attention=options).msa_sparse_attention()
    # Without the flag nothing changes.
    plain = planned(PlannedTwinOps(), msa_sparse_attention=dict(kv_major_kernel="tma"))
    assert plain.msa_sparse_attention() == ("attention", {"kv_major_kernel": "tma"})


def test_no_tma_stores_runs_the_smoke_with_the_tma_kernel_calls_skipped(capsys):
    only = "sparse [kv_major/tma] flat bf16 2/2 topk32|sparse [kv_major] flat bf16 2/2 topk32"
    assert sanitize_smoke.main(["--no-tma-stores", "--list", "--only", only]) == 0
    assert capsys.readouterr().out.splitlines() == listed(only)
    smoke = sanitize_smoke.Smoke(sanitize_smoke.no_tma_stores(msa_ops), torch.device("cpu"), only)
    smoke.run_parts()
    out = capsys.readouterr().out
    assert smoke.failed == [], out
    assert smoke.passed == ["sparse [kv_major] flat bf16 2/2 topk32"]
    assert smoke.skipped == ["sparse [kv_major/tma] flat bf16 2/2 topk32"]
    assert "SKIP sparse [kv_major/tma] flat bf16 2/2 topk32: NotImplementedError: --no-tma-stores" in out
