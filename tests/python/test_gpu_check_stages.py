"""scripts/gpu_check.sh's stages step (SWEEP / TIMELINE: benchmarks/profile_stages.py) without a GPU:
a wrapper PYTHON prints what profile_stages.py prints and hands every other command to the real
interpreter, so that the arguments the step passes, its log and its summary line (the sweep totals,
a failing run failing the step) are tested here. ``cpu_only`` (conftest.py)."""

import shutil
import sys

import pytest

from conftest import cpu_only
from test_gpu_check_sanitizer import gpu_check

pytestmark = [cpu_only,
              pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                 reason="needs bash and coreutils' timeout")]

WRAPPER = r"""#!/usr/bin/env bash
if [[ $1 == benchmarks/profile_stages.py ]]; then
  echo "wrapper args: $*"
  echo "## [sweep] pipeline 131072 tile_max_waste=default: 44.100 ms of kernels per call"
  echo "     20.000 ms  x33   kv_major_sm90_kernel"
  echo "## [sweep] pipeline 131072 kv_major_math=precise: 45.200 ms of kernels per call; 45.6 ms on the GPU"
  echo "## [host] pipeline 8192: proxy 29.0, top-k 22.3, transpose 16.2, sparse attention 130.3 us of host" \
       "time per call (median of 20)"
  echo "## [host, steady] step B1/32K bf16/bf16: proxy 20.0, top-k 15.0, sparse decode 40.0, step 80.0 us of" \
       "host time per call (median of 20 calls back to back, the GPU busy throughout)"
  exit ${FAKE_STAGES_RC:-0}
fi
exec "%s" "$@"
"""


def run_stages(tmp_path, **env):
    wrapper = tmp_path / "python"
    wrapper.write_text(WRAPPER % sys.executable)
    wrapper.chmod(0o755)
    out = tmp_path / "out"
    proc = gpu_check(out, **dict(dict(SKIP_TESTS="1", SKIP_BENCH="1", SKIP_SANITIZER="1",
                                      PYTHON=str(wrapper)), **env))
    summary = (out / "summary.txt").read_text()
    lines = [ln for ln in summary.splitlines() if ln.startswith("stages ")]
    return proc, lines, out


def passed_log(proc, out) -> str:
    """stages.log of a gpu_check run that passed."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return (out / "stages.log").read_text()


def test_sweep_and_timeline_reach_profile_stages_and_the_summary(tmp_path):
    proc, lines, out = run_stages(tmp_path, SWEEP="pipeline:131072:default,kv_major_math=precise random:32768:2",
                                  TIMELINE="1/128K,64/32K")
    log = passed_log(proc, out)
    assert ("wrapper args: benchmarks/profile_stages.py --sweep pipeline:131072:default,kv_major_math=precise "
            "--sweep random:32768:2 --timeline 1/128K,64/32K") in log, log
    assert len(lines) == 1 and " PASS " in lines[0], lines
    assert ("pipeline 131072 tile_max_waste=default: 44.100 ms; "
            "pipeline 131072 kv_major_math=precise: 45.200 ms; host 8192: ") in lines[0], lines[0]


def test_stages_args_reach_profile_stages(tmp_path):
    """STAGES_ARGS: more profile_stages.py arguments, split with shell quoting."""
    proc, lines, out = run_stages(tmp_path, TIMELINE="1/128K/1/fp8/fp8",
                                  STAGES_ARGS="--proxy-options 'decode_tma_issue=warps' --decode-options 'split_warps=8'")
    log = passed_log(proc, out)
    assert ("wrapper args: benchmarks/profile_stages.py --timeline 1/128K/1/fp8/fp8 "
            "--proxy-options decode_tma_issue=warps --decode-options split_warps=8") in log, log


def test_a_failing_run_fails_the_step(tmp_path):
    proc, lines, _ = run_stages(tmp_path, TIMELINE="1/128K", FAKE_STAGES_RC="3")
    assert proc.returncode == 1
    assert len(lines) == 1 and " FAIL " in lines[0], lines


def test_host_time_reaches_profile_stages_and_the_summary(tmp_path):
    proc, lines, out = run_stages(tmp_path, HOST_TIME="8K,32K,1/32K")
    log = passed_log(proc, out)
    assert "wrapper args: benchmarks/profile_stages.py --host 8K,32K,1/32K" in log, log
    assert len(lines) == 1 and " PASS " in lines[0], lines
    assert lines[0].endswith("host 8192: proxy 29.0, top-k 22.3, transpose 16.2, sparse attention 130.3 us; "
                             "host steady B1/32K bf16/bf16: proxy 20.0, top-k 15.0, sparse decode 40.0, step 80.0 us"), \
        lines[0]


def test_no_step_without_sweep_or_timeline(tmp_path):
    proc, lines, out = run_stages(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert lines == [] and not (out / "stages.log").exists()
