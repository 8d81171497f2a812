"""``python -m flashmsa demo`` end to end on the CPU: JSON and text output, needle recall, accuracy
against the reference, option handling; plus the progress bar. The demo runs (CPU only) are marked
``cpu_only`` (conftest.py): CI runs them, the GPU check leaves them to it; option errors and
``flashmsa info`` still run there."""

import argparse
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import cpu_only
from flashmsa import __main__ as cli
from flashmsa import demo


def _run(*args, timeout=600):
    env = dict(os.environ, FLASHMSA_NUM_THREADS=os.environ.get("FLASHMSA_NUM_THREADS", "2"))
    return subprocess.run([sys.executable, "-m", "flashmsa", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@cpu_only
def test_demo_json_m3_shapes():
    r = _run("demo", "--device", "cpu", "--seqlen", "1024", "--json", "--no-progress")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # one JSON object and nothing else on stdout
    cfg = out["config"]
    assert (cfg["heads"], cfg["kv_heads"], cfg["index_heads"], cfg["topk"],
            cfg["local_blocks"]) == (64, 4, 4, 16, 1)
    assert out["passed"] is True
    assert out["needles"]["planted"] == 8 and out["needles"]["recall"] == 1.0
    acc = out["accuracy"]
    assert acc["rel_l2_err"] <= 1e-2 and acc["max_abs_err"] < 2e-2
    assert acc["rows_checked"] >= 512
    t = out["timing_ms"]
    for key in ("proxy_score", "topk_select", "sparse_attention", "pipeline"):
        assert t[key] > 0
    assert "dense_sdpa" not in t  # dense timing is for CUDA from 32K tokens
    assert out["timing_of"].startswith("CPU reference")
    assert 0 < acc["density"] <= 1
    # 1024 tokens are 8 blocks: top-16 selects every one of them (dense attention), said twice.
    assert len(out["warnings"]) == 1 and "covers all 8 blocks" in out["warnings"][0]
    assert "warning: top-16 covers all 8 blocks" in r.stderr


@cpu_only
def test_demo_text_paged_fp8_shared_selection():
    r = _run("demo", "--device", "cpu", "--seqlen", "1500", "--qlen", "300", "--batch", "2",
             "--layout", "packed", "--kv-dtype", "fp8", "--index-heads", "2", "--heads", "16",
             "--check-rows", "100000")
    assert r.returncode == 0, r.stdout + r.stderr
    text = r.stdout
    for needle in ("recall 100.0%", "all query rows", "proxy score", "top-k select",
                   "sparse attention", "pipeline total", "KV fp8, packed layout", "PASS",
                   "density ", "% of the keys dense causal attention reads",
                   "time per stage of the CPU reference", "warning   top-16 covers all 12 blocks"):
        assert needle in text, (needle, text)


@cpu_only
def test_demo_sparse_run_has_no_warning_and_says_density():
    # 2176 tokens = 17 blocks: top-16 leaves the last queries' earliest blocks out.
    cfg = demo.DemoConfig(device="cpu", seqlen=2176, qlen=256, heads=8, kv_heads=4,
                          index_heads=4, needles=2, check_rows=64)
    result = demo.run_demo(cfg, progress_enabled=False)
    assert result["passed"] and result["warnings"] == []
    assert result["accuracy"]["density"] < 1.0
    text = demo.format_report(result)
    assert "sparsity" not in text and "warning" not in text
    density = [line for line in text.splitlines() if line.startswith("density ")]
    assert len(density) == 1
    assert f"{100 * result['accuracy']['density']:.1f}% of the keys" in density[0]
    assert demo.selection_warnings(dataclasses.replace(cfg, topk=17))  # 17 >= 17 blocks


@cpu_only
def test_demo_timings_labelled_by_device():
    base = demo.run_demo(demo.DemoConfig(device="cpu", seqlen=256, heads=4, kv_heads=4,
                                         needles=0, check=False), progress_enabled=False)
    assert "time per stage of the CPU reference" in demo.format_report(base)
    gpu = dict(base, config=dict(base["config"], device="cuda", iters=20),
               timing_of="CUDA kernels")
    text = demo.format_report(gpu)
    assert "time per stage (median of 20):" in text and "CPU reference" not in text


def test_demo_help_names_every_default():
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    options = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    assert len(options) >= 20
    for action in options:
        assert action.help and "(default: " in action.help, action.option_strings
    text = parser.format_help()
    for flag in ("--batch", "--kv-heads", "--topk", "--local-blocks", "--sink-blocks",
                 "--needles", "--seed", "--no-dense", "--no-progress", "--json"):
        assert flag in text
    assert "(default: 16)" in text and "(default: flat)" in text


@cpu_only
def test_demo_nvfp4_in_process():
    cfg = demo.DemoConfig(device="cpu", seqlen=640, qlen=48, heads=16, kv_heads=4,
                          kv_dtype="nvfp4", layout="paged", needles=3)
    result = demo.run_demo(cfg, progress_enabled=False)
    assert result["passed"], result
    assert result["needles"]["recall"] == 1.0
    assert result["accuracy"]["rel_l2_err"] <= 1e-2


@pytest.mark.parametrize("args,message", [
    (["--layout", "packed", "--kv-dtype", "nvfp4"], "NVFP4"),
    (["--dtype", "fp16", "--kv-dtype", "bf16"], "--kv-dtype bf16 needs --dtype bf16"),
    (["--qlen", "5000"], "--qlen"),
    (["--heads", "10"], "multiple of --kv-heads"),
])
def test_demo_rejects_bad_options(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["demo", "--device", "cpu", "--seqlen", "4096", *args])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_cli_info_and_help(capsys):
    assert cli.main(["info"]) == 0
    assert "built_with_cuda" in json.loads(capsys.readouterr().out)
    assert cli.main([]) == 2
    assert "demo" in capsys.readouterr().out


@cpu_only
@pytest.mark.skipif(shutil.which("flashmsa") is None,
                    reason="the flashmsa console script is installed by `pip install`")
def test_console_script():
    r = subprocess.run(["flashmsa", "demo", "--device", "cpu", "--seqlen", "512", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and json.loads(r.stdout)["passed"]


def test_progress_bar_draws_and_clears():
    stream = io.StringIO()
    with demo.ticking(demo.progress_bar(4, enabled=True, delay=0.0, stream=stream)) as bar:
        bar.set_description_str("proxy score", refresh=False)
        bar.update()
        bar.update(2)
    text = stream.getvalue()
    assert "proxy score" in text and " 75.0%" in text
    assert text.endswith("\r")  # the line is cleared at the end


def test_progress_bar_silent_when_short_or_disabled():
    stream = io.StringIO()
    with demo.ticking(demo.progress_bar(2, enabled=True, delay=60.0, stream=stream)) as bar:
        bar.set_description_str("x", refresh=False)
        bar.update()
    assert stream.getvalue() == ""
    stream = io.StringIO()
    with demo.ticking(demo.progress_bar(2, enabled=False, delay=0.0, stream=stream)) as bar:
        bar.update()
    assert stream.getvalue() == ""
    stream = io.StringIO()  # not a terminal: off unless forced
    with demo.ticking(demo.progress_bar(2, stream=stream, delay=0.0)) as bar:
        bar.update()
    assert stream.getvalue() == ""
