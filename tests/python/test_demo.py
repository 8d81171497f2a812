"""``python -m flashmsa demo`` end to end on the CPU: JSON and text output, needle recall, accuracy
against the reference, option handling; plus the progress bar."""

import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from flashmsa import __main__ as cli
from flashmsa import demo


def _run(*args, timeout=600):
    env = dict(os.environ, FLASHMSA_NUM_THREADS=os.environ.get("FLASHMSA_NUM_THREADS", "2"))
    return subprocess.run([sys.executable, "-m", "flashmsa", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


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


def test_demo_text_paged_fp8_shared_selection():
    r = _run("demo", "--device", "cpu", "--seqlen", "1500", "--qlen", "300", "--batch", "2",
             "--layout", "packed", "--kv-dtype", "fp8", "--index-heads", "2", "--heads", "16",
             "--check-rows", "100000")
    assert r.returncode == 0, r.stdout + r.stderr
    text = r.stdout
    for needle in ("recall 100.0%", "all query rows", "proxy score", "top-k select",
                   "sparse attention", "pipeline total", "KV fp8, packed layout", "PASS"):
        assert needle in text, (needle, text)


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
