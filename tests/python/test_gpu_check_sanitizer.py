"""scripts/gpu_check.sh's sanitizer step without a GPU: a fake compute-sanitizer
(COMPUTE_SANITIZER) prints what the real one and benchmarks/sanitize_smoke.py print, so that the
job pool (SANITIZER_JOBS shards per tool, SANITIZER_PARALLEL at a time), the per-tool merged logs
and the summary (errors summed, calls counted, a failing or budget-cut shard failing its tool) are
tested here. No kernel runs: ``cpu_only`` (conftest.py), left to CI by the GPU check."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cpu_only

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [cpu_only,
              pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                 reason="needs bash and coreutils' timeout")]

# Smoke calls of the fake: shard i/n ran the cases k < CALLS with k % n == i - 1.
CALLS = 20

FAKE = r"""#!/usr/bin/env bash
# fake compute-sanitizer: --tool T [options] PYTHON benchmarks/sanitize_smoke.py --shard I/N [--only X]
tool="" shard="" resume=""
args=("$@")
for ((k = 0; k < ${#args[@]}; k++)); do
  case ${args[k]} in
    --tool) tool=${args[k + 1]} ;;
    --shard) shard=${args[k + 1]} ;;
    --resume) resume=", $(grep -c '^PASS ' "${args[k + 1]}") done in ${args[k + 1]}" ;;
  esac
done
if [[ " $* " == *"/initcheck_tma_store "* ]]; then
  # tests/sanitizer/run_initcheck_tma_store.sh's program (built by the fake NVCC) under initcheck:
  # mode 0 st.global, 1 TMA store, 2 bulk store, 3 nothing written. FAKE_SAN_TMA: "unseen" (the
  # TMA-stored bytes reported), "seen" (not reported) or "broken" (st.global reported too).
  mode=${args[${#args[@]} - 1]}
  echo "mode $mode (fake): bytes as written (sum 1, expected 1)"
  case $mode:${FAKE_SAN_TMA:-seen} in
    3:*|1:unseen|2:unseen|0:broken|1:broken) echo "========= Uninitialized __global__ memory read of size 16 bytes" ;;
  esac
  exit 0
fi
if [[ " $* " == *"initcheck_control.py"* ]]; then
  # initcheck's positive control: the real tool reports the uninitialized read in a flashmsa kernel.
  if [[ -z ${FAKE_SAN_CONTROL_SILENT:-} ]]; then
    echo "========= Uninitialized __global__ memory read of size 4 bytes"
    echo "=========     at flashmsa::cuda::topk::split::topk_split_kernel(flashmsa::TopkSelectParams)+0x1a0"
    echo "========= ERROR SUMMARY: 1 error"
  else
    echo "========= ERROR SUMMARY: 0 errors"
  fi
  exit 0
fi
echo "$tool $shard start $(date +%s.%N)" >>"$FAKE_SAN_TRACE"
echo "fake args: $*"
i=${shard%/*} n=${shard#*/} total=${FAKE_SAN_CALLS:-20}
mine=$(( i <= total ? (total - i) / n + 1 : 0 ))
failed=0
[[ " ${FAKE_SAN_FAILED:-} " == *" $tool:$i "* ]] && failed=1
for ((c = 0; c < mine; c++)); do
  echo "PASS case $(( i - 1 + c * n ))"
  [[ $c == 0 ]] && sleep "${FAKE_SAN_SLEEP:-0}"
done
errors=0
[[ " ${FAKE_SAN_ERRORS:-} " == *" $tool:$i "* ]] && errors=2
echo "sanitize_smoke: $(( mine - failed )) passed, 0 skipped, $failed failed$resume, shard $shard ($mine of $total calls) in 0.1 s"
if [[ $tool == racecheck ]]; then
  echo "========= RACECHECK SUMMARY: $errors hazards displayed ($errors errors, 0 warnings)"
else
  echo "========= ERROR SUMMARY: $errors errors"
fi
echo "$tool $shard end $(date +%s.%N)" >>"$FAKE_SAN_TRACE"
(( errors )) && exit 97
exit $failed
"""


def gpu_check(out, **env):
    """scripts/gpu_check.sh with OUT=out, the caller's environment less this script's knobs, plus
    env; returns the finished process."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SANITIZER_", "SKIP_", "FAKE_SAN_", "PYTEST_", "FUZZ", "PROFILE"))
            and k not in ("OUT", "FULL", "TIME_BUDGET", "COMPUTE_SANITIZER", "SWEEP", "TIMELINE")}
    base.update(SKIP_BUILD="1", SKIP_CTEST="1", OUT=str(out), FLASHMSA_COMMIT="test")
    base.update(env)
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=base, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


# fake nvcc: creates the -o file (run_initcheck_tma_store.sh builds its program with NVCC).
FAKE_NVCC = r"""#!/usr/bin/env bash
while (( $# )); do [[ $1 == -o ]] && : >"$2"; shift; done
"""


def run_check(tmp_path, **env):
    fake = tmp_path / "fake-compute-sanitizer"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    nvcc = tmp_path / "fake-nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    out = tmp_path / "out"
    proc = gpu_check(out, **dict(dict(SKIP_TESTS="1", SKIP_BENCH="1", COMPUTE_SANITIZER=str(fake),
                                      NVCC=str(nvcc), FAKE_SAN_TRACE=str(tmp_path / "trace"),
                                      PYTHON=sys.executable),
                                 **env))
    summary = (out / "summary.txt").read_text()
    line = next(ln for ln in summary.splitlines() if ln.startswith("sanitizer "))
    return proc, line, out


def trace(tmp_path):
    events = []
    for ln in (tmp_path / "trace").read_text().splitlines():
        tool, shard, what, t = ln.split()
        events.append((float(t), what == "start", tool, shard))
    return events


def test_shards_of_every_tool_run_in_a_pool_and_add_up(tmp_path):
    proc, line, out = run_check(tmp_path, SANITIZER_TOOLS="memcheck racecheck", SANITIZER_JOBS="3",
                                SANITIZER_PARALLEL="4", SANITIZER_ONLY="hostile|proxy",
                                FAKE_SAN_SLEEP="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " PASS " in line, line
    for tool in ("memcheck", "racecheck"):
        assert f"{tool}: 0 errors, {CALLS}/{CALLS} calls ({CALLS} passed, 0 skipped, 0 failed), " \
               f"3 shard(s) of " in line, line
        merged = (out / f"sanitizer-{tool}.log").read_text()
        for i in (1, 2, 3):
            assert f"##### shard {i}/3: exit 0" in merged
            assert f"--shard {i}/3 --only hostile|proxy" in merged
        # Every case once, over the shards.
        cases = sorted(int(c) for c in re.findall(r"^PASS case (\d+)$", merged, re.M))
        assert cases == list(range(CALLS))
    assert sorted(p.name for p in out.glob("sanitizer-*.log")) == [
        "sanitizer-memcheck.log", "sanitizer-racecheck.log"]  # shard logs merged
    # 6 shards, at most 4 at a time, and really concurrent.
    running = peak = 0
    events = sorted(trace(tmp_path))
    assert sum(start for _, start, _, _ in events) == 6
    for _, start, _, _ in events:
        running += 1 if start else -1
        peak = max(peak, running)
    assert 2 <= peak <= 4, events


def test_a_failing_shard_fails_its_tool(tmp_path):
    proc, line, out = run_check(tmp_path, SANITIZER_TOOLS="memcheck racecheck initcheck",
                                SANITIZER_JOBS="4", FAKE_SAN_ERRORS="racecheck:2",
                                FAKE_SAN_FAILED="initcheck:4", SANITIZER_KEEP_SHARD_LOGS="1")
    assert proc.returncode == 1
    assert " FAIL " in line, line
    tma, memcheck, racecheck, initcheck, control = line.split(" | ")
    assert tma.endswith("initcheck sees TMA stores (control): its smoke calls as they are"), tma
    assert control.startswith("initcheck control: uninitialized reads reported"), control
    assert "memcheck: 0 errors, 20/20 calls" in memcheck and "; shard" not in memcheck
    assert "racecheck: 2 errors, 20/20 calls" in racecheck and "shard 2/4 2 errors" in racecheck
    assert "initcheck: 0 errors, 20/20 calls (19 passed, 0 skipped, 1 failed)" in initcheck
    assert "shard 4/4 exit 1 (1 failed smoke calls)" in initcheck
    assert (out / "sanitizer-racecheck-2.log").exists()  # SANITIZER_KEEP_SHARD_LOGS
    assert "##### shard 2/4: exit 97" in (out / "sanitizer-racecheck.log").read_text()


def test_a_shard_cut_by_the_time_budget_is_reported(tmp_path):
    # TIME_BUDGET 27 leaves the step a few seconds (15 are kept for the summary, the header takes
    # some): each shard is cut after its first call (or not started, on a slow machine).
    proc, line, _ = run_check(tmp_path, SANITIZER_TOOLS="memcheck", SANITIZER_JOBS="2",
                              TIME_BUDGET="27", FAKE_SAN_SLEEP="60")
    assert proc.returncode == 1
    assert " FAIL " in line, line
    assert re.search(r"shard 1/2 cut by TIME_BUDGET after [01] smoke calls", line), line
    assert re.search(r"shard 2/2 cut by TIME_BUDGET after [01] smoke calls", line), line


def test_unknown_tool_fails_the_step(tmp_path):
    proc, line, _ = run_check(tmp_path, SANITIZER_TOOLS="memcheck leakcheck")
    assert proc.returncode == 1
    assert "unknown tool 'leakcheck'" in line


def test_kernel_filter_reaches_every_tool_but_initcheck(tmp_path):
    proc, line, out = run_check(tmp_path, SANITIZER_TOOLS="memcheck initcheck", SANITIZER_JOBS="1",
                                SANITIZER_KERNEL_FILTER="kns=flashmsa")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fake args: --tool memcheck --error-exitcode 97 --print-limit 100 --leak-check no " \
           "--kernel-name kns=flashmsa " in (out / "sanitizer-memcheck.log").read_text()
    initcheck = (out / "sanitizer-initcheck.log").read_text()
    assert "fake args: --tool initcheck " in initcheck and "--kernel-name" not in initcheck


def test_initcheck_without_its_positive_control_fails(tmp_path):
    # The control (tests/sanitizer/initcheck_control.py) reads memory nothing wrote in a flashmsa
    # kernel: an initcheck that does not report it checked nothing, and the step fails.
    proc, line, out = run_check(tmp_path, SANITIZER_TOOLS="initcheck", SANITIZER_JOBS="2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "initcheck control: uninitialized reads reported in flashmsa kernels (1)" in line, line
    proc, line, out = run_check(tmp_path, SANITIZER_TOOLS="initcheck", SANITIZER_JOBS="2",
                                FAKE_SAN_CONTROL_SILENT="1")
    assert proc.returncode == 1
    assert " FAIL " in line and "initcheck: 0 errors, 20/20 calls" in line, line
    assert "initcheck control: no uninitialized read reported in a flashmsa kernel" in line, line
    assert (out / "sanitizer-initcheck-control.log").exists()


@pytest.mark.parametrize("tma", ["unseen", "seen", "broken"])
def test_initcheck_smoke_without_tma_stores_only_where_its_control_says(tmp_path, tma):
    # tests/sanitizer/run_initcheck_tma_store.sh first: where initcheck reports the TMA-stored
    # bytes (and not the st.global ones, and the unwritten ones), initcheck's shards, and only
    # theirs, run the smoke with --no-tma-stores; otherwise the calls stay as they are.
    proc, line, out = run_check(tmp_path, SANITIZER_TOOLS="memcheck initcheck", SANITIZER_JOBS="2",
                                FAKE_SAN_TMA=tma)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    initcheck = (out / "sanitizer-initcheck.log").read_text()
    assert "--no-tma-stores" not in (out / "sanitizer-memcheck.log").read_text()
    control = (out / "sanitizer-initcheck-control.log").read_text()
    assert "===== tests/sanitizer/run_initcheck_tma_store.sh" in control
    assert "mode 1 (fake): bytes as written" in control
    if tma == "unseen":
        args = [ln for ln in initcheck.splitlines() if ln.startswith("fake args: ")]
        assert len(args) == 2 and all(ln.endswith(" --no-tma-stores") for ln in args), args
        assert "initcheck does not see TMA stores (control: 1 reports on TMA-stored bytes, " \
               "0 on st.global): its smoke calls with --no-tma-stores" in line, line
    else:
        assert "--no-tma-stores" not in initcheck
        want = ("initcheck sees TMA stores (control)" if tma == "seen" else
                "initcheck's TMA-store control inconclusive (st.global 1, TMA 1, nothing written 1")
        assert want in line, line


def test_pytest_args_keep_quoted_words(tmp_path):
    """PYTEST_ARGS is split with shell quoting: a -k expression with spaces reaches pytest as one
    argument (a plain word split once handed pytest "or" and the next word as paths)."""
    record = tmp_path / "pytest-args"
    fake_py = tmp_path / "python"
    fake_py.write_text(
        "#!/usr/bin/env bash\n"
        'if [[ $1 == -m && $2 == pytest ]]; then printf "%s\\n" "${@:3}" >"$FAKE_PYTEST_ARGS"; exit 0; fi\n'
        'if [[ $* == *cuda.is_available* ]]; then exit 0; fi\n'  # "a GPU is there"
        f'exec "{sys.executable}" "$@"\n')
    fake_py.chmod(0o755)
    gpu_check(tmp_path / "out", SKIP_SANITIZER="1", SKIP_BENCH="1", PYTHON=str(fake_py),
              FAKE_PYTEST_ARGS=str(record), PYTEST_ARGS="-k 'topk or proxy_decode' -x")
    args = record.read_text().splitlines()
    assert args[-3:] == ["-k", "topk or proxy_decode", "-x"], args


def test_profile_case_that_hangs_is_cut(tmp_path):
    """A profile case is cut after PROFILE_CASE_TIMEOUT seconds (a kernel that hangs under ncu took
    the rest of a device call's budget once), the next case still runs, and the step fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_ncu = bin_dir / "ncu"
    fake_ncu.write_text(
        "#!/usr/bin/env bash\n"
        'case "$*" in *"--case hang"*) exec sleep 60;; esac\n'
        'echo "profiled: ${@: -1}"\n')
    fake_ncu.chmod(0o755)
    out = tmp_path / "out"
    proc = gpu_check(out, SKIP_TESTS="1", SKIP_SANITIZER="1", SKIP_BENCH="1", PYTHON=sys.executable,
                     PATH=f"{bin_dir}:{os.environ['PATH']}", PROFILE="hang,fine",
                     PROFILE_CASE_TIMEOUT="2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    log = (out / "profile.log").read_text()
    assert "profile case hang: cut after 2 s or the budget (a hang?)" in log, log
    assert "profiled: fine" in log, log
    line = next(ln for ln in (out / "summary.txt").read_text().splitlines() if ln.startswith("profile "))
    assert " FAIL " in line and "2 case(s): hang,fine" in line, line


def test_resume_finishes_one_tools_cut_run(tmp_path):
    earlier = tmp_path / "racecheck-earlier.log"
    earlier.write_text("".join(f"PASS case {k} (1.0 s)\n" for k in range(7)))
    proc, line, out = run_check(tmp_path, SANITIZER_TOOLS="racecheck", SANITIZER_JOBS="2",
                                SANITIZER_RESUME=str(earlier))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"racecheck: 0 errors, {CALLS}/{CALLS} calls ({CALLS} passed, 0 skipped, 0 failed) " \
           f"besides 7 done in {earlier}, 2 shard(s) of " in line, line
    assert f"--resume {earlier}" in (out / "sanitizer-racecheck.log").read_text()


@pytest.mark.parametrize("tools,file,why", [
    ("memcheck racecheck", True, "SANITIZER_RESUME needs exactly one tool"),
    ("racecheck", False, "SANITIZER_RESUME: no file"),
])
def test_resume_refuses_what_it_cannot_mean(tmp_path, tools, file, why):
    earlier = tmp_path / "earlier.log"
    if file:
        earlier.write_text("PASS case 0 (1.0 s)\n")
    proc, line, _ = run_check(tmp_path, SANITIZER_TOOLS=tools, SANITIZER_RESUME=str(earlier))
    assert proc.returncode == 1
    assert " FAIL " in line and why in line, line
