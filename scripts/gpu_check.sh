#!/usr/bin/env bash
# One-call GPU check of flashmsa, run on the GPU machine from the repository root:
#
#   bash scripts/gpu_check.sh                      # build, tests, sanitizers, quick benchmark
#   FULL=1 SKIP_BUILD=1 SKIP_TESTS=1 SKIP_SANITIZER=1 bash scripts/gpu_check.sh   # full benchmark
#
# On an H200 (ded51a7 / 2f7070a): build ~75-80 s, ctest ~40 s, the Python suite ~60 s, the quick
# benchmark of a few stages ~15-60 s; the sanitizers over all smoke calls as 16 shards: memcheck,
# initcheck and synccheck ~2 min together, racecheck ~4.5 min by itself (next to the other tools
# it is cut: the shards share the CPU cores). So one 600 s call holds the build, tests, bench and
# profiles plus either the three fast tools or racecheck: SKIP_SANITIZER=1 for the first part,
# then SKIP_BUILD=1 SKIP_CTEST=1 SKIP_TESTS=1 SKIP_BENCH=1 SANITIZER_TOOLS=... for the second.
# Each call rebuilds on a fresh machine.
#
# Steps, each timed, each logging to $OUT/<step>.log ($OUT if set, else ./.out):
#   build      pip install of the package with CUDA for sm_80 and sm_90a (build dir build-gpu/,
#              incremental), then a check that the installed package has CUDA kernels; the
#              build's longest steps (ninja's log) to $OUT/build_times.txt
#   ctest      the C++ GoogleTest suites of that build (only when .deps/googletest is there)
#   pytest     pytest tests/python -m "not cpu_only" (the whole suite but the tests marked cpu_only,
#              which touch no CUDA tensor or kernel and which CI's CPU run covers: pyproject.toml,
#              tests/python/conftest.py), -n $PYTEST_WORKERS (16) --dist worksteal where
#              pytest-xdist is installed (worksteal from xdist 3.2, else its default scheduling);
#              fails if any test is skipped for want of CUDA/a GPU (on a one-GPU machine the tests
#              that need two, test_gpu_multi_device.py, are named as not run instead)
#   fuzz       only with FUZZ=<seconds>: benchmarks/fuzz_msa.py for that long (capped by the time
#              budget), every op against the CPU reference, to $OUT/fuzz.log (failures as one-line
#              --replay reproducers)
#   sanitizer  compute-sanitizer memcheck, racecheck, initcheck and synccheck on
#              benchmarks/sanitize_smoke.py: each tool as SANITIZER_JOBS processes, one a shard
#              (--shard i/SANITIZER_JOBS), all tools' shards through one pool of SANITIZER_PARALLEL
#              processes sharing the GPU; each shard logs to $OUT/sanitizer-<tool>-<i>.log while it
#              runs, merged at the end into $OUT/sanitizer-<tool>.log; per tool the summary sums the
#              shards (errors, calls) and names any shard that failed or was cut by the budget;
#              with synccheck, also tests/sanitizer/run_mbarrier_patterns.sh (which producer /
#              consumer mbarrier forms synccheck reports, per mode) to
#              $OUT/sanitizer-mbarrier-patterns.log, its counts in the summary; with initcheck,
#              first tests/sanitizer/run_initcheck_tma_store.sh (whether initcheck counts a TMA
#              store as a write; where it does not, initcheck's smoke calls run with
#              --no-tma-stores: the KV-major partials by stg stores, the TMA KV-major kernel's
#              calls skipped), then
#              its positive control tests/sanitizer/initcheck_control.py (an uninitialized read
#              in a flashmsa kernel must be reported, else the step fails) to
#              $OUT/sanitizer-initcheck-control.log. H200, 482 calls, 16 shards: memcheck,
#              initcheck and synccheck ~2 min together, racecheck ~4.5 min by itself; H100 at
#              b1dd4fa, 1289 calls, 8 shards each: memcheck 37-44 s a shard, synccheck 22-25 s
#   bench      benchmarks/bench_msa.py (--quick unless FULL=1), JSON to $OUT/bench.json
#   stages     only with SWEEP=..., TIMELINE=... or HOST_TIME=...: benchmarks/profile_stages.py, the kernels of a
#              call by torch.profiler (no Nsight Compute replay): --sweep per SWEEP spec (kernel
#              totals per call of bench_msa's M3 builders under each plan-option point, e.g. an
#              option A/B at 128K; each call's span on the GPU and its gaps), --timeline TIMELINE (the
#              captured decode step's kernels and gaps), --host HOST_TIME (each pipeline or decode
#              step op's host time: the GPU idle, and steady),
#              to $OUT/stages.log; the sweep totals in the summary
#   micro      only with MICRO=1: benchmarks/micro/kv_stream.cu built by nvcc (sm_90a) and run at
#              512, 1024, 2048 and 4096 units (34 / 67 / 134 / 268 MB), and 4096 with the decode
#              benchmark's page layout (heads): the load forms' ceilings, and 1024 units on 13 SMs
#              (the per-SM rate of each form with the rest of the GPU idle); then
#              benchmarks/micro/kernel_gap.cu (the hand-off between two dependent kernels of a
#              graph by grid size, shared-memory carveout and PDL) at 200 KB and 1 KB, and
#              benchmarks/micro/l2_partials.cu (a KV-major group's partials kept in L2 against
#              written to HBM, phases by launches or by grid barriers), then
#              benchmarks/micro/cluster_placement.cu (the SMs a thread-block cluster's CTAs land on,
#              by shared memory and threads, and what sharing an SM costs a latency-bound CTA);
#              to $OUT/micro.log
#   profile    only with PROFILE=case,...: Nsight Compute (ncu) on each named case of
#              benchmarks/profile_msa.py (--list), one call of the op, all its kernels, to
#              $OUT/profile.log (SOL, memory, occupancy, warp stalls, source hot spots)
# A one-screen summary is printed last and written to $OUT/summary.txt. The exit status is 1 if any
# step failed; the summary is printed either way.
#
# Environment: SKIP_BUILD=1 SKIP_CTEST=1 SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 FULL=1
#   PYTEST_ARGS="..."          extra pytest arguments, split with shell quoting (shlex), e.g.
#                              PYTEST_ARGS='-k "topk or proxy_decode"' (unquoted, "-k topk or x"
#                              would hand pytest "or" and "x" as paths); note "-k gpu" leaves out the
#                              cuda-parametrized and validation tests, which run on the GPU build too
#   PYTEST_WORKERS=16          pytest-xdist workers (conftest.py gives each cores / workers torch
#                              threads: with a core's worth each, OpenMP spin-waiting slowed the
#                              CPU side of the tests several-fold)
#   PYTEST_MARKERS="not cpu_only"   the -m expression; PYTEST_MARKERS= (empty) runs every test
#   PYTEST_SHARD=i/n           only every n-th test file from the i-th (the whole suite needed two
#                              calls, 1/2 and 2/2, before the cpu_only marker, the per-worker
#                              memo of CPU references and the thread share; one call now)
#   SANITIZER_TOOLS="..."      default "memcheck racecheck initcheck synccheck" (any of them;
#                              another name fails the step)
#   SANITIZER_JOBS=8           shards (concurrent compute-sanitizer processes) per tool
#   SANITIZER_PARALLEL=nproc   processes at a time over all tools (each holds a CUDA context,
#                              ~0.5 GB+ of GPU memory, and about a CPU core)
#   SANITIZER_KERNEL_FILTER=kns=flashmsa  compute-sanitizer --kernel-name for memcheck, racecheck
#                              and synccheck: only the library's kernels instrumented, not torch's
#                              that build each call's inputs (not initcheck: it must see their
#                              writes); unset: every kernel. With synccheck the step checks
#                              that the filter instruments namespace flashmsa
#   SANITIZER_KEEP_SHARD_LOGS=1  keep the shard logs beside the merged ones (a device call brings
#                              back at most 8 files)
#   COMPUTE_SANITIZER=path     the compute-sanitizer to run (default: found on PATH or in CUDA)
#   SANITIZER_ONLY=substring   only the smoke calls whose name holds it (sanitize_smoke.py --only;
#                              alternatives separated by '|', e.g. "hybrid|proxy")
#   SANITIZER_RESUME=file      finish a cut run of one tool (SANITIZER_TOOLS names exactly that
#                              one): the smoke calls that file, that tool's merged log of the
#                              earlier run (a path in the repository, so that it travels), reports
#                              as PASS or SKIP are left out (sanitize_smoke.py --resume), the rest
#                              shared by the shards; the summary says how many were done before
#   BENCH_ARGS="..."           extra bench_msa.py arguments (e.g. "--stages decode")
#   FUZZ=seconds               run the fuzzer (fuzz step) for that long; FUZZ_ARGS="..." extra
#                              fuzz_msa.py arguments (e.g. "--seed 1000000 --ops attention")
#   MICRO=1                    run the micro step (needs an sm_90 GPU; independent of the build);
#                              MICRO=name,... only those tools (kv_stream, kernel_gap, l2_partials,
#                              cluster_placement)
#   SWEEP="spec spec"          profile_stages.py --sweep specs KIND:TOKENS:W,... separated by spaces
#                              (e.g. "pipeline:131072:default,kv_major_math=precise"; W: default, a
#                              tile_max_waste bound or KEY=VALUE+...)
#   TIMELINE=B/CTX[/SQ[/IDX[/KV]]],...  profile_stages.py --timeline cases (the graphed decode step)
#   STAGES_ARGS="..."          extra profile_stages.py arguments (e.g. "--proxy-options
#                              decode_tma_issue=warps" for the timeline's steps)
#   HOST_TIME=8K,32K,1/32K     profile_stages.py --host items: prefill sizes (each pipeline op's host time
#                              per call) and decode step cases B/CTX[/SQ[/IDX[/KV]]] (each step op's),
#                              the GPU idle before each call and busy throughout
#   PROFILE=a,b                profile_msa.py cases to run under ncu (e.g. "proxy_decode_b64")
#   PROFILE_CASE_TIMEOUT=150   seconds one profile case may take (a hang costs no more)
#   PROFILE_KERNEL=regex       only the kernels of those cases whose name matches (ncu
#                              --kernel-name regex:...), PROFILE_LAUNCHES (2) launches of them
#                              after the first PROFILE_SKIP (0) matching ones
#   PROFILE_METRICS=a,b        metrics collected beside the sections (ncu --metrics; e.g.
#                              "regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio":
#                              cycles per issued instruction stalled for each reason)
#   PROFILE_SOURCE=1           also each case's per-instruction page (ncu --page source
#                              --print-source sass --csv: executed instructions and warp stall
#                              samples of every SASS instruction) to $OUT/profile-source-<case>.csv.gz
#                              (a second profiled run of the case, the same kernel filter)
#   TIME_BUDGET=seconds        default 570: steps are cut short so the summary is printed before a
#                              600 s device call ends; a cut step counts as failed
#   GPU_ARCHS="80;90a"         CUDA architectures of the build (e.g. 90a: a faster build on an H200,
#                              without the portable sm_80 image the other GPUs run)
#   PYTHON=python3  CMAKE_BUILD_PARALLEL_LEVEL=16  FLASHMSA_COMMIT=<sha> (when the copy has no .git;
#                              the sha written out: "$(git rev-parse ...)" in the command runs on the
#                              GPU machine, whose copied .git may hold an older commit than the tree,
#                              and names that one; left unset, the header marks such a copy -dirty)
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
ROOT=$PWD
OUT_DIR=${OUT:-$ROOT/.out}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
TIME_BUDGET=${TIME_BUDGET:-570}
SUMMARY_RESERVE=15
T0=$SECONDS
export PYTHONUNBUFFERED=1
# CMake and the sanitizer look for nvcc / compute-sanitizer on PATH.
[[ -d /usr/local/cuda/bin ]] && export PATH="$PATH:/usr/local/cuda/bin"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}

STEP_NAMES=()
STEP_RESULTS=()
STEP_SECONDS=()
STEP_DETAILS=()

record() {  # name result seconds detail
  STEP_NAMES+=("$1"); STEP_RESULTS+=("$2"); STEP_SECONDS+=("$3"); STEP_DETAILS+=("$4")
  printf '== %-9s %-5s %4ss  %s\n' "$1" "$2" "$3" "$4"
}

remaining() { echo $(( TIME_BUDGET - (SECONDS - T0) - SUMMARY_RESERVE )); }

# run_logged <log> <command...>: runs the command under the remaining time budget, output to log
# (and the tail of it on the console); returns its exit status (124 when cut by the budget).
run_logged() {  # RUN_CAP=<s> (optional): at most that long, whatever the budget leaves
  local log=$1; shift
  local left; left=$(remaining)
  if (( left < 5 )); then
    echo "no time left in TIME_BUDGET=$TIME_BUDGET" >>"$log"
    return 124
  fi
  if (( ${RUN_CAP:-0} > 0 && RUN_CAP < left )); then left=$RUN_CAP; fi
  timeout --signal=TERM --kill-after=10 "$left" "$@" >>"$log" 2>&1
}

trim_log() {  # keep logs under the 16 MiB a returned file may have
  local f=$1
  if [[ -f $f ]] && (( $(stat -c %s "$f") > 15000000 )); then
    { head -c 2000000 "$f"; printf '\n... [trimmed] ...\n'; tail -c 12000000 "$f"; } >"$f.tmp"
    mv "$f.tmp" "$f"
  fi
}

find_sanitizer() {
  local c
  # COMPUTE_SANITIZER: an explicit one (tests/python/test_gpu_check_sanitizer.py passes a fake).
  if [[ -n ${COMPUTE_SANITIZER:-} ]]; then
    [[ -x $COMPUTE_SANITIZER ]] && { echo "$COMPUTE_SANITIZER"; return 0; }
    return 1
  fi
  for c in "$(command -v compute-sanitizer 2>/dev/null)" /usr/local/cuda/bin/compute-sanitizer \
           /usr/local/cuda/compute-sanitizer/compute-sanitizer /opt/cuda/bin/compute-sanitizer; do
    [[ -n $c && -x $c ]] && { echo "$c"; return 0; }
  done
  return 1
}

# ---- header ---------------------------------------------------------------------------------
HEADER=$(
  commit=${FLASHMSA_COMMIT:-}
  if [[ -z $commit ]]; then
    # "-dirty": tracked files differ from HEAD (e.g. a copied working tree with an older .git).
    commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
    [[ $commit != unknown && -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]] && commit+=-dirty
  fi
  echo "flashmsa gpu_check  $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit $commit"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null \
    | sed 's/^/gpu: /' || echo "gpu: nvidia-smi unavailable"
  echo "nvcc: $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' | head -1)  $($PY -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpu_visible", torch.cuda.is_available())' 2>&1 | tail -1)"
)
echo "$HEADER"

# ---- (a) build ------------------------------------------------------------------------------
step_build() {
  local log=$OUT_DIR/build.log start=$SECONDS rc
  : >"$log"
  local defs=(-C build-dir=build-gpu
              -C "cmake.define.FLASHMSA_ENABLE_CUDA=ON"
              -C "cmake.define.CMAKE_CUDA_ARCHITECTURES=${GPU_ARCHS:-80;90a}")
  if [[ -z ${SKIP_CTEST:-} && -f .deps/googletest/CMakeLists.txt ]]; then
    defs+=(-C "cmake.define.FLASHMSA_BUILD_TESTS=ON"
           -C "cmake.define.FLASHMSA_GTEST_SOURCE_DIR=$ROOT/.deps/googletest")
  else
    defs+=(-C "cmake.define.FLASHMSA_BUILD_TESTS=OFF")
  fi
  if [[ ! -f pyproject.toml ]]; then
    echo "no pyproject.toml in $ROOT" >>"$log"; rc=1
  else
    run_logged "$log" "$PY" -m pip install --no-build-isolation --no-deps -v . "${defs[@]}"
    rc=$?
    # Where the build's time goes (ninja's own log of this build's steps): the compile span and the
    # longest steps, to $OUT/build_times.txt (which translation units bound a fresh build).
    local nlog
    nlog=$(find build-gpu -name .ninja_log -newer pyproject.toml 2>/dev/null | head -1)
    [[ -n $nlog ]] && awk 'NR > 1 { t = ($2 - $1) / 1000; if ($2 > end) end = $2; n++; sum += t
                                     print t, $4 }
                           END { printf "%d steps, %.0f s of compile over a %.0f s span\n", n, sum, end / 1000 > "/dev/stderr" }' \
      "$nlog" 2>"$OUT_DIR/build_times.txt" | sort -rn | head -12 >>"$OUT_DIR/build_times.txt"
  fi
  if (( rc == 0 )); then
    # The installed package must run a kernel: a CPU-only build would raise NotImplementedError.
    run_logged "$log" "$PY" - <<'EOF'
import torch
from flashmsa import msa_ops
s = torch.randn((4, 24, 64), device="cuda")
out = msa_ops.msa_topk_select(s, 16)
torch.cuda.synchronize()
assert out.is_cuda and out.shape == (64, 4, 16), out.shape
print("flashmsa CUDA kernels: ok")
# A rejected call must raise (an iostream-formatted message once crashed the module instead).
try:
    msa_ops.msa_topk_select(s, 16, num_valid_pages=1000)
except ValueError as e:
    assert "num_valid_pages" in str(e) and "1000" in str(e), e
else:
    raise AssertionError("msa_topk_select(num_valid_pages=1000) did not raise")
print("flashmsa errors: ok")
EOF
    rc=$?
  fi
  trim_log "$log"
  local detail="pip install build-gpu/ (${GPU_ARCHS:-80;90a})"
  (( rc == 124 )) && detail="cut by TIME_BUDGET"
  if (( rc != 0 && rc != 124 )); then
    detail=$(grep -m1 -E 'error:|Error:|FAILED|fatal' "$log" | cut -c1-120)
    [[ -n $detail ]] || detail=$(tail -1 "$log" | cut -c1-120)
  fi
  record build "$( ((rc == 0)) && echo PASS || echo FAIL)" $(( SECONDS - start )) "$detail"
}

step_ctest() {
  local log=$OUT_DIR/ctest.log start=$SECONDS rc
  : >"$log"
  if [[ ! -f build-gpu/tests/cpp/CTestTestfile.cmake ]]; then
    record ctest SKIP 0 "no C++ tests in build-gpu/ (needs .deps/googletest)"
    return
  fi
  run_logged "$log" ctest --test-dir build-gpu --output-on-failure --timeout 300
  rc=$?
  trim_log "$log"
  local detail
  detail=$(grep -E 'tests passed|tests failed' "$log" | tail -1)
  (( rc == 124 )) && detail="cut by TIME_BUDGET; $detail"
  record ctest "$( ((rc == 0)) && echo PASS || echo FAIL)" $(( SECONDS - start )) "${detail:-no result line}"
}

# ---- (b) pytest -----------------------------------------------------------------------------
step_pytest() {
  local log=$OUT_DIR/pytest.log start=$SECONDS rc
  : >"$log"
  if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >>"$log" 2>&1; then
    record pytest FAIL 0 "torch sees no CUDA device: GPU tests would only skip"
    return
  fi
  # The whole suite but the cpu_only tests (no CUDA tensor, no kernel: CI's CPU run covers them);
  # the other CPU-side tests (validation, hostile inputs, opcheck, ...) run too, against the CUDA
  # build of the module (a "-k gpu" selection once hid that any error message with a number
  # crashed it). In parallel where pytest-xdist is installed (serially it does not fit one device
  # call); worksteal (xdist >= 3.2) keeps each worker on a contiguous run of tests, so the
  # parametrisations of a case that share its memoised CPU reference (conftest.Memo) stay together,
  # and idle workers take over the tail of the busiest one.
  local par=()
  if "$PY" -c 'import xdist, pytest_timeout' >/dev/null 2>&1; then
    par=(-n "${PYTEST_WORKERS:-16}" --timeout 300)
    if "$PY" -c 'from xdist.scheduler import WorkStealingScheduling' >/dev/null 2>&1; then
      par+=(--dist worksteal)
    fi
  fi
  local markers=()
  [[ -n ${PYTEST_MARKERS-not cpu_only} ]] && markers=(-m "${PYTEST_MARKERS-not cpu_only}")
  # PYTEST_ARGS: words split with shell quoting, so that a -k expression may hold spaces.
  local extra=()
  if [[ -n ${PYTEST_ARGS:-} ]]; then
    mapfile -t extra < <("$PY" -c 'import shlex, sys; print("\n".join(shlex.split(sys.argv[1])))' "$PYTEST_ARGS")
  fi
  # --durations: the slowest tests (mostly the CPU reference they compare with) in the log, to
  # see where the device time of a full run goes.
  # PYTEST_SHARD=i/n: only every n-th test file, starting at the i-th (1-based) of the sorted list
  # (a suite that outgrows one 600 s device call again). -v: one line per test (PASSED / FAILED
  # with its id), so a run cut by the budget still names its failures.
  local files=(tests/python)
  if [[ -n ${PYTEST_SHARD:-} ]]; then
    local shard_i=${PYTEST_SHARD%/*} shard_n=${PYTEST_SHARD#*/} idx=0 f
    files=()
    for f in $(ls tests/python/test_*.py | sort); do
      (( idx % shard_n == shard_i - 1 )) && files+=("$f")
      idx=$((idx + 1))
    done
    echo "PYTEST_SHARD=$PYTEST_SHARD: ${files[*]}" >>"$log"
  fi
  # Each test's outcome and duration, and each failure's full report, as the test ends (conftest.py):
  # $OUT/pytest-reports/{durations.tsv,failures.txt}, complete also when the budget cuts the run.
  export FLASHMSA_TEST_REPORT_DIR="$OUT_DIR/pytest-reports"
  rm -rf "$FLASHMSA_TEST_REPORT_DIR"
  echo "pytest ${files[*]} ${markers[*]} ${par[*]} ${extra[*]}" >>"$log"
  run_logged "$log" "$PY" -m pytest "${files[@]}" -v -rfEs -p no:cacheprovider --durations=25 "${markers[@]}" "${par[@]}" "${extra[@]}"
  rc=$?
  trim_log "$log"
  local result gpu_skips
  result=$(grep -E '[0-9]+ (passed|failed|errors?|skipped)|no tests ran' "$log" | grep -E ' in [0-9.]+s' | tail -1 | tr -d '=' | sed 's/^ *//;s/ *$//')
  # A test skipped because CUDA or a GPU is missing did not run: on this machine that is a failure.
  # Tests that need two GPUs (test_gpu_multi_device.py) cannot run on a one-GPU machine: counted
  # and named in the summary as not run, not as a failure (they count as failures where two GPUs are).
  local multi_skips=0 n_gpus
  n_gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  if (( n_gpus < 2 )); then
    multi_skips=$(grep -E '^SKIPPED' "$log" | grep -E 'needs two CUDA devices' \
                  | sed -E 's/^SKIPPED \[([0-9]+)\].*/\1/' | awk '{n += $1} END {print n + 0}')
  fi
  gpu_skips=$(grep -E '^SKIPPED' "$log" | grep -iE 'cuda|gpu' \
              | { if (( n_gpus < 2 )); then grep -v 'needs two CUDA devices'; else cat; fi; } \
              | sed -E 's/^SKIPPED \[([0-9]+)\].*/\1/' | awk '{n += $1} END {print n + 0}')
  if (( gpu_skips > 0 )); then
    echo "== $gpu_skips test(s) skipped for want of CUDA/GPU:" >>"$log"
    grep -E '^SKIPPED' "$log" | grep -iE 'cuda|gpu' | head -5
    (( rc == 0 )) && rc=1
  fi
  local detail="${result:-no result line}"
  (( gpu_skips > 0 )) && detail="$detail; $gpu_skips skipped for want of CUDA"
  (( multi_skips > 0 )) && detail="$detail; $multi_skips need two GPUs (not run: $n_gpus here)"
  # Failures as the -v lines name them (also when the budget cut the run before pytest's summary).
  local failed
  failed=$(grep -oE '(FAILED|ERROR) tests/python/[^ ]+' "$log" | sort -u)
  if [[ -n $failed ]]; then
    echo "== failed:" >>"$log"; echo "$failed" >>"$log"
    echo "$failed" >"$OUT_DIR/pytest-failed.txt"
    detail="$detail; $(echo "$failed" | wc -l) failed (pytest-failed.txt)"
    (( rc == 0 )) && rc=1
  fi
  if [[ -f $FLASHMSA_TEST_REPORT_DIR/durations.tsv ]]; then
    echo "== slowest tests (s, outcome, phase, id):" >>"$log"
    sort -rn "$FLASHMSA_TEST_REPORT_DIR/durations.tsv" | head -25 >>"$log"
  fi
  (( rc == 124 )) && detail="cut by TIME_BUDGET; $detail"
  record pytest "$( ((rc == 0)) && echo PASS || echo FAIL)" $(( SECONDS - start )) "$detail"
}

# ---- (c) compute-sanitizer ------------------------------------------------------------------
# Each tool runs as SANITIZER_JOBS compute-sanitizer processes, process i over
# `sanitize_smoke.py --shard i/SANITIZER_JOBS` (every SANITIZER_JOBS-th smoke call from the i-th),
# all tools' shards in one pool of SANITIZER_PARALLEL processes at a time, tool after tool: the
# sanitizers' cost is mostly on the host (instrumentation callbacks, reports), so processes
# sharing the one GPU run nearly in parallel. Each shard writes its own log; when all are done the
# step merges them into one log per tool ($OUT/sanitizer-<tool>.log: a device call brings back
# at most 8 files) and sums them up per tool.

# san_shard <tool> <i> <n> <log> <status file>: one shard under run_logged; writes "<rc> <secs>".
san_shard() {
  local tool=$1 i=$2 n=$3 log=$4 status=$5 t0=$SECONDS rc
  local args=(--tool "$tool" --error-exitcode 97 --print-limit 100)
  [[ $tool == memcheck ]] && args+=(--leak-check no)
  # Only the library's kernels instrumented (SANITIZER_KERNEL_FILTER, e.g. kns=flashmsa); never for
  # initcheck, which must see the writes of torch's kernels that build the inputs.
  [[ -n ${SANITIZER_KERNEL_FILTER:-} && $tool != initcheck ]] && args+=(--kernel-name "$SANITIZER_KERNEL_FILTER")
  local smoke=(benchmarks/sanitize_smoke.py --shard "$i/$n")
  [[ -n ${SANITIZER_ONLY:-} ]] && smoke+=(--only "$SANITIZER_ONLY")
  [[ -n ${SANITIZER_RESUME:-} ]] && smoke+=(--resume "$SANITIZER_RESUME")
  [[ $tool == initcheck ]] && smoke+=("${INITCHECK_SMOKE_ARGS[@]}")
  echo "===== compute-sanitizer ${args[*]} ${smoke[*]}" >"$log"
  # Without the caching allocator every tensor is its own cudaMalloc, so memcheck sees
  # out-of-bounds accesses that would otherwise land inside a pooled block. One CPU thread per
  # process: the pool already fills the cores.
  run_logged "$log" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 OMP_NUM_THREADS=1 \
    "$SAN" "${args[@]}" "$PY" "${smoke[@]}"
  rc=$?
  echo "$rc $(( SECONDS - t0 ))" >"$status"
}

# san_summary <tool> <n> <dir>: merges the tool's shard logs into $OUT/sanitizer-<tool>.log and
# prints "<0|1> <detail>" (1: the tool failed).
san_summary() {
  local tool=$1 n=$2 dir=$3 i log summary smoke errors rc secs bad=0
  local total_errors=0 passed=0 skipped=0 failed=0 matched="" resumed="" calls problems="" tmin="" tmax=0
  local merged=$OUT_DIR/sanitizer-$tool.log
  : >"$merged"
  for (( i = 1; i <= n; i++ )); do
    log=$OUT_DIR/sanitizer-$tool-$i.log
    read -r rc secs <"$dir/$tool-$i.status" 2>/dev/null || { rc=1; secs=0; }
    [[ -f $log ]] || echo "(no log)" >"$log"
    summary=$(grep -E '(ERROR|RACECHECK|INITCHECK|SYNCCHECK) SUMMARY' "$log" | tail -1 | sed 's/^========= //')
    smoke=$(grep -E '^sanitize_smoke:' "$log" | tail -1)
    # Errors: "ERROR SUMMARY: N errors" (memcheck) or "(N errors, M warnings)" (racecheck).
    errors=$(grep -oE 'SUMMARY: [0-9]+ errors?|\([0-9]+ errors?' <<<"$summary" | grep -oE '[0-9]+' | tail -1)
    total_errors=$(( total_errors + ${errors:-0} ))
    if [[ $smoke =~ ([0-9]+)\ passed,\ ([0-9]+)\ skipped,\ ([0-9]+)\ failed ]]; then
      passed=$(( passed + BASH_REMATCH[1] )); skipped=$(( skipped + BASH_REMATCH[2] ))
      failed=$(( failed + BASH_REMATCH[3] ))
    fi
    [[ $smoke =~ \(([0-9]+)\ of\ ([0-9]+)\ calls\) ]] && matched=${BASH_REMATCH[2]}
    [[ $smoke =~ ,\ ([0-9]+)\ done\ in\  ]] && resumed=${BASH_REMATCH[1]}
    (( secs > tmax )) && tmax=$secs
    [[ -z $tmin ]] || (( secs < tmin )) && tmin=$secs
    local why=""
    if (( rc == 124 )); then
      why="cut by TIME_BUDGET after $(grep -cE '^(PASS|SKIP|FAIL) ' "$log") smoke calls"
    elif [[ -z $summary ]]; then
      why="no sanitizer summary (exit $rc)"
    elif (( ${errors:-0} > 0 )); then
      why="${errors} errors"
    elif (( rc != 0 )); then
      why="exit $rc"
      [[ $smoke =~ ([1-9][0-9]*\ failed) ]] && why+=" (${BASH_REMATCH[1]} smoke calls)"
    fi
    if [[ -n $why ]]; then
      bad=1
      problems+="; shard $i/$n $why"
    fi
    { echo "##### shard $i/$n: exit $rc, ${secs}s"; cat "$log"; echo; } >>"$merged"
    [[ -n ${SANITIZER_KEEP_SHARD_LOGS:-} ]] || rm -f "$log"
  done
  trim_log "$merged"
  calls=$(( passed + skipped + failed ))
  local detail="$tool: $total_errors errors, ${calls}/${matched:-?} calls ($passed passed, $skipped skipped, $failed failed)"
  [[ -n $resumed ]] && detail+=" besides $resumed done in $SANITIZER_RESUME"
  detail+=", $n shard(s) of ${tmin:-0}-${tmax} s"
  [[ $calls != "${matched:-?}" ]] && bad=1
  echo "$bad $detail$problems"
}

step_sanitizer() {
  local start=$SECONDS rc=0 tool detail="" tools=${SANITIZER_TOOLS:-memcheck racecheck initcheck synccheck}
  local n=${SANITIZER_JOBS:-8} parallel=${SANITIZER_PARALLEL:-$(nproc 2>/dev/null || echo 8)}
  for tool in $tools; do
    case $tool in
      memcheck|racecheck|initcheck|synccheck) ;;
      *) record sanitizer FAIL 0 "SANITIZER_TOOLS: unknown tool '$tool' (memcheck, racecheck, initcheck, synccheck)"
         return ;;
    esac
  done
  if ! [[ $n =~ ^[1-9][0-9]*$ && $parallel =~ ^[1-9][0-9]*$ ]]; then
    record sanitizer FAIL 0 "SANITIZER_JOBS / SANITIZER_PARALLEL must be positive numbers"
    return
  fi
  if [[ -n ${SANITIZER_RESUME:-} ]]; then
    if [[ $(wc -w <<<"$tools") != 1 ]]; then
      record sanitizer FAIL 0 "SANITIZER_RESUME needs exactly one tool in SANITIZER_TOOLS (the one whose log it is), got '$tools'"
      return
    fi
    if [[ ! -f $SANITIZER_RESUME ]]; then
      record sanitizer FAIL 0 "SANITIZER_RESUME: no file $SANITIZER_RESUME"
      return
    fi
  fi
  if ! SAN=$(find_sanitizer); then
    record sanitizer FAIL 0 "compute-sanitizer not found"
    return
  fi
  local dir i line
  dir=$(mktemp -d)
  rm -f "$OUT_DIR"/sanitizer-*.log
  # Whether initcheck counts a TMA store as a write (tests/sanitizer/run_initcheck_tma_store.sh:
  # bytes written by st.global, by a TMA tensor store, by a bulk store, by nothing). Where it does
  # not (the TMA-stored bytes reported, the two controls right), the KV-major partials, which the
  # combine reads, go by stg stores in initcheck's smoke calls (--no-tma-stores); otherwise every
  # such read is reported and the reports past the print limit slow the shards to a stop (H100 at
  # b1dd4fa: all 8 shards cut after ~75 calls). Its log opens the initcheck control's log.
  INITCHECK_SMOKE_ARGS=()
  if [[ " $tools " == *" initcheck "* ]]; then
    local tlog=$dir/tma-store.log m0 m1 m3
    COMPUTE_SANITIZER=$SAN timeout 180 bash tests/sanitizer/run_initcheck_tma_store.sh "$dir/tma-store" \
      >"$tlog" 2>&1
    reports() { sed -n "s/^mode $1 .*| initcheck: \([0-9]*\) report.*/\1/p" "$tlog"; }
    m0=$(reports 0) m1=$(reports 1) m3=$(reports 3)
    if [[ $m0 == 0 && -n $m3 && $m3 != 0 && -n $m1 && $m1 != 0 ]]; then
      INITCHECK_SMOKE_ARGS=(--no-tma-stores)
      detail+="initcheck does not see TMA stores (control: $m1 reports on TMA-stored bytes, 0 on st.global): its smoke calls with --no-tma-stores | "
    elif [[ $m0 == 0 && -n $m3 && $m3 != 0 && $m1 == 0 ]]; then
      detail+="initcheck sees TMA stores (control): its smoke calls as they are | "
    else
      detail+="initcheck's TMA-store control inconclusive (st.global ${m0:-?}, TMA ${m1:-?}, nothing written ${m3:-?} reports): its smoke calls as they are | "
    fi
  fi
  # The pool: tool after tool, shard after shard, at most $parallel at a time.
  for tool in $tools; do
    for (( i = 1; i <= n; i++ )); do
      while (( $(jobs -rp | wc -l) >= parallel )); do wait -n 2>/dev/null; done
      san_shard "$tool" "$i" "$n" "$OUT_DIR/sanitizer-$tool-$i.log" "$dir/$tool-$i.status" &
    done
  done
  wait
  for tool in $tools; do
    line=$(san_summary "$tool" "$n" "$dir")
    [[ ${line%% *} == 0 ]] || rc=1
    detail+="${line#* } | "
  done
  # The producer / consumer mbarrier forms under synccheck (tests/sanitizer/mbarrier_patterns.cu):
  # which of them the tool reports, for the tile kernel's report (informational, not a failure).
  if [[ " $tools " == *" synccheck "* ]] && (( $(remaining) > 30 )); then
    local plog=$OUT_DIR/sanitizer-mbarrier-patterns.log
    COMPUTE_SANITIZER=$SAN KERNEL_FILTER=${SANITIZER_KERNEL_FILTER:-} timeout "$(remaining)" \
      bash tests/sanitizer/run_mbarrier_patterns.sh "$dir/patterns" >"$plog" 2>&1
    detail+="mbarrier patterns (synccheck reports per mode): $(sed -n 's/^mode \([0-9]\):.*synccheck: \([0-9]*\) report.*/\1:\2/p' "$plog" | tr '\n' ' ')| "
    # The filter check: a kernel of namespace flashmsa must be instrumented under the filter, else
    # the filtered tools checked nothing of the library and fail.
    if [[ -n ${SANITIZER_KERNEL_FILTER:-} ]]; then
      local seen
      seen=$(sed -n "s/^filter ${SANITIZER_KERNEL_FILTER}: mode 0 under synccheck: \([0-9]*\) report.*/\1/p" "$plog")
      if [[ -n $seen && $seen != 0 ]]; then
        detail+="kernel filter ${SANITIZER_KERNEL_FILTER} instruments namespace flashmsa ($seen reports on mode 0) | "
      else
        rc=1
        detail+="kernel filter ${SANITIZER_KERNEL_FILTER} instruments no flashmsa kernel (mode 0: ${seen:-no result}) | "
      fi
    fi
  fi
  # initcheck's positive control (tests/sanitizer/initcheck_control.py): a flashmsa kernel reading
  # memory nothing wrote must be reported, else the initcheck shards checked nothing.
  if [[ " $tools " == *" initcheck "* ]]; then
    local clog=$OUT_DIR/sanitizer-initcheck-control.log seen
    { echo "===== tests/sanitizer/run_initcheck_tma_store.sh"; cat "$dir/tma-store.log" 2>/dev/null
      echo "===== tests/sanitizer/initcheck_control.py"; } >"$clog"
    timeout 120 env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SAN" --tool initcheck --print-limit 1000 \
      "$PY" tests/sanitizer/initcheck_control.py >>"$clog" 2>&1
    # A report names the kernel in its "at" line or, for an inlined helper (__ldg), in a
    # "Device Frame:" line a few lines further (H200 at bff5899: 5 lines after the report).
    seen=$(awk '/Uninitialized __global__ memory read/ {n = 8; next} n > 0 {n--; if (/flashmsa::/) {c++; n = 0}}
                END {print c + 0}' "$clog")
    if (( seen > 0 )); then
      detail+="initcheck control: uninitialized reads reported in flashmsa kernels ($seen) | "
    else
      rc=1
      detail+="initcheck control: no uninitialized read reported in a flashmsa kernel ($clog) | "
    fi
  fi
  rm -rf "$dir"
  record sanitizer "$( ((rc == 0)) && echo PASS || echo FAIL)" $(( SECONDS - start )) "${detail% | }"
}

# ---- (c') fuzzer (only with FUZZ=seconds) ---------------------------------------------------
step_fuzz() {
  local log=$OUT_DIR/fuzz.log start=$SECONDS rc secs
  : >"$log"
  if ! [[ $FUZZ =~ ^[0-9]+$ ]]; then
    record fuzz FAIL 0 "FUZZ must be a number of seconds, got '$FUZZ'"
    return
  fi
  # Leave the fuzzer's own clean stop (workers finish their case, counts printed) inside the budget.
  secs=$(( $(remaining) - 30 ))
  (( secs > FUZZ )) && secs=$FUZZ
  if (( secs < 10 )); then
    record fuzz FAIL 0 "no time left in TIME_BUDGET=$TIME_BUDGET"
    return
  fi
  # shellcheck disable=SC2086
  run_logged "$log" "$PY" benchmarks/fuzz_msa.py --seconds "$secs" ${FUZZ_ARGS:-}
  rc=$?
  trim_log "$log"
  local detail
  detail=$(grep -E '^fuzz_msa:' "$log" | tail -1 | sed 's/^fuzz_msa: //')
  (( rc == 124 )) && detail="cut by TIME_BUDGET; ${detail}"
  record fuzz "$( ((rc == 0)) && echo PASS || echo FAIL)" $(( SECONDS - start )) "${detail:-no result line}"
}

# ---- (d) benchmarks -------------------------------------------------------------------------
step_bench() {
  local log=$OUT_DIR/bench.log start=$SECONDS rc mode=--quick
  : >"$log"
  [[ -n ${FULL:-} && ${FULL} != 0 ]] && mode=""
  # shellcheck disable=SC2086
  run_logged "$log" "$PY" benchmarks/bench_msa.py $mode --out "$OUT_DIR/bench.json" ${BENCH_ARGS:-}
  rc=$?
  trim_log "$log"
  local detail
  detail=$(grep -E '^[0-9]+ cases in' "$log" | tail -1)
  [[ -n $detail ]] || detail=$(tail -1 "$log" | cut -c1-120)
  (( rc == 124 )) && detail="cut by TIME_BUDGET; ${detail}"
  record bench "$( ((rc == 0)) && echo PASS || echo FAIL)" $(( SECONDS - start )) "${mode:-full}: ${detail:-no result line}"
}

# ---- (d'') kernel totals per call by torch.profiler (only with SWEEP=..., TIMELINE=... or HOST_TIME=...) --
step_stages() {
  local log=$OUT_DIR/stages.log start=$SECONDS rc=0 s args=()
  : >"$log"
  for s in ${SWEEP:-}; do args+=(--sweep "$s"); done
  [[ -n ${TIMELINE:-} ]] && args+=(--timeline "$TIMELINE")
  [[ -n ${HOST_TIME:-} ]] && args+=(--host "$HOST_TIME")
  if [[ -n ${STAGES_ARGS:-} ]]; then
    local extra
    mapfile -t extra < <("$PY" -c 'import shlex, sys; print("\n".join(shlex.split(sys.argv[1])))' "$STAGES_ARGS")
    args+=("${extra[@]}")
  fi
  run_logged "$log" "$PY" benchmarks/profile_stages.py "${args[@]}" || rc=$?
  trim_log "$log"
  # One "point: X ms" per sweep point, in the order run.
  local detail
  detail=$( { sed -nE 's/^## \[sweep\] (.*): ([0-9.]+ ms) of kernels per call.*/\1: \2/p' "$log"
             sed -nE 's/^## \[host\] (pipeline|step) ([^:]+): (.*) us of host time per call.*/host \2: \3 us/p' "$log"
             sed -nE 's/^## \[host, steady\] (pipeline|step) ([^:]+): (.*) us of host time per call.*/host steady \2: \3 us/p' \
               "$log"; } |
           paste -sd ';' - | sed 's/;/; /g')
  [[ -n $detail ]] || detail="-> stages.log"
  (( rc == 124 )) && detail="cut by TIME_BUDGET; ${detail}"
  record stages "$( ((rc == 0)) && echo PASS || echo FAIL)" $(( SECONDS - start )) "$detail"
}

# ---- (d') load-form microbenchmark (only with MICRO=1) ----------------------------------------
step_micro() {
  local log="$OUT_DIR/micro.log" start=$SECONDS rc=0 ran=()
  : >"$log"
  mkdir -p build-gpu
  # MICRO=1: every tool; MICRO=name,...: those of kv_stream, kernel_gap, l2_partials, cluster_placement.
  want() { [[ $MICRO == 1 || ,$MICRO, == *,$1,* ]] && ran+=("$1"); }
  if want kv_stream; then
    run_logged "$log" nvcc -std=c++20 -O3 -arch=sm_90a -Icsrc -Iinclude benchmarks/micro/kv_stream.cu -lcuda \
      -o build-gpu/kv_stream || rc=1
    if (( rc == 0 )); then
      for units in 512 1024 2048 4096; do run_logged "$log" build-gpu/kv_stream "$units" || rc=1; done
      run_logged "$log" build-gpu/kv_stream 4096 heads || rc=1
      # A tenth of the SMs streaming while the rest idle: the per-SM rate of each load form.
      run_logged "$log" build-gpu/kv_stream 1024 random 13 || rc=1
    fi
  fi
  # The hand-off between two dependent kernels of a graph, by grid size, shared-memory carveout
  # and programmatic dependent launch.
  if want kernel_gap; then
    run_logged "$log" nvcc -std=c++20 -O3 -arch=sm_90a benchmarks/micro/kernel_gap.cu -o build-gpu/kernel_gap || rc=1
    if (( rc == 0 )); then
      run_logged "$log" build-gpu/kernel_gap || rc=1
      run_logged "$log" build-gpu/kernel_gap 1024 || rc=1
    fi
  fi
  # Partials of KV-major groups kept in L2 against written to HBM, by launches or grid barriers.
  if want l2_partials; then
    run_logged "$log" nvcc -std=c++20 -O3 -arch=sm_90a benchmarks/micro/l2_partials.cu -o build-gpu/l2_partials || rc=1
    (( rc == 0 )) && { run_logged "$log" build-gpu/l2_partials || rc=1; }
  fi
  # Where a thread-block cluster's CTAs land (SMs per cluster) by shared memory and threads.
  if want cluster_placement; then
    run_logged "$log" nvcc -std=c++20 -O3 -arch=sm_90a benchmarks/micro/cluster_placement.cu \
      -o build-gpu/cluster_placement || rc=1
    (( rc == 0 )) && { run_logged "$log" build-gpu/cluster_placement || rc=1; }
  fi
  (( ${#ran[@]} > 0 )) || { rc=1; echo "MICRO=$MICRO names no tool" >>"$log"; }
  record micro "$( ((rc == 0)) && echo PASS || echo FAIL)" $(( SECONDS - start )) \
    "${ran[*]:-none} -> micro.log"
}

# ---- (f) Nsight Compute profiles (only with PROFILE=case,case,...) ----------------------------
find_ncu() {
  local c
  for c in "$(command -v ncu 2>/dev/null)" /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
    [[ -n $c && -x $c ]] && { echo "$c"; return 0; }
  done
  return 1
}

step_profile() {
  local log=$OUT_DIR/profile.log start=$SECONDS rc=0 c ncu n=0
  : >"$log"
  if ! ncu=$(find_ncu); then
    record profile FAIL 0 "ncu not found"
    return
  fi
  # Sections: where the time goes (SOL), the memory system, occupancy and launch, why warps stall
  # (warp state + the source lines they stall on), the issue slots.
  local sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy
                  --section LaunchStats --section WarpStateStats --section SchedulerStats
                  --section ComputeWorkloadAnalysis --section SourceCounters)
  # PROFILE_KERNEL=<regex>: only the kernels whose name matches, at most PROFILE_LAUNCHES (default
  # 2) launches of them (e.g. one KV-major launch of a prefill's nine launch groups), after the
  # first PROFILE_SKIP (default 0) matching launches (e.g. past a near-empty first group).
  local only=()
  [[ -n ${PROFILE_KERNEL:-} ]] && only=(--kernel-name "regex:${PROFILE_KERNEL}"
                                        --launch-skip "${PROFILE_SKIP:-0}"
                                        --launch-count "${PROFILE_LAUNCHES:-2}")
  # Each case at most PROFILE_CASE_TIMEOUT seconds (default 150): a kernel that hangs under the
  # profiler (as a ring bug did at 4f75a66, 293 s to the end of the budget) costs that much only.
  [[ -n ${PROFILE_METRICS:-} ]] && only+=(--metrics "${PROFILE_METRICS}")
  local case_rc
  for c in ${PROFILE//,/ }; do
    echo "===== $c" >>"$log"
    case_rc=0
    RUN_CAP=${PROFILE_CASE_TIMEOUT:-150} run_logged "$log" "$ncu" --profile-from-start off \
      --clock-control none "${sections[@]}" "${only[@]}" "$PY" benchmarks/profile_msa.py --case "$c" ||
      case_rc=$?
    if (( case_rc == 124 || case_rc == 137 )); then
      echo "profile case $c: cut after ${PROFILE_CASE_TIMEOUT:-150} s or the budget (a hang?)" >>"$log"
    fi
    (( case_rc == 0 )) || rc=1
    if [[ ${PROFILE_SOURCE:-0} == 1 ]]; then
      case_rc=0
      RUN_CAP=${PROFILE_CASE_TIMEOUT:-150} run_logged "$OUT_DIR/profile-source-$c.csv" "$ncu" \
        --profile-from-start off --clock-control none --section SourceCounters --section WarpStateStats \
        "${only[@]}" --page source --print-source sass --csv "$PY" benchmarks/profile_msa.py --case "$c" ||
        case_rc=$?
      gzip -f "$OUT_DIR/profile-source-$c.csv"
      (( case_rc == 0 )) || rc=1
    fi
    n=$((n + 1))
  done
  trim_log "$log"
  record profile "$( ((rc == 0)) && echo PASS || echo FAIL)" $(( SECONDS - start )) \
    "$n case(s): ${PROFILE} -> profile.log"
}

if [[ -n ${SKIP_BUILD:-} ]]; then record build SKIP 0 "SKIP_BUILD"; else step_build; fi
if [[ -n ${SKIP_CTEST:-} ]]; then record ctest SKIP 0 "SKIP_CTEST"
elif [[ -n ${SKIP_TESTS:-} ]]; then record ctest SKIP 0 "SKIP_TESTS"
else step_ctest; fi
if [[ -n ${SKIP_TESTS:-} ]]; then record pytest SKIP 0 "SKIP_TESTS"; else step_pytest; fi
[[ -n ${FUZZ:-} ]] && step_fuzz
if [[ -n ${SKIP_SANITIZER:-} ]]; then record sanitizer SKIP 0 "SKIP_SANITIZER"; else step_sanitizer; fi
if [[ -n ${SKIP_BENCH:-} ]]; then record bench SKIP 0 "SKIP_BENCH"; else step_bench; fi
[[ -n ${SWEEP:-}${TIMELINE:-}${HOST_TIME:-} ]] && step_stages
[[ -n ${MICRO:-} ]] && step_micro
[[ -n ${PROFILE:-} ]] && step_profile

# ---- (e) summary ----------------------------------------------------------------------------
failed=0
{
  echo "$HEADER"
  echo
  printf '%-10s %-5s %6s  %s\n' step result secs detail
  for i in "${!STEP_NAMES[@]}"; do
    printf '%-10s %-5s %6s  %s\n' "${STEP_NAMES[$i]}" "${STEP_RESULTS[$i]}" "${STEP_SECONDS[$i]}" "${STEP_DETAILS[$i]}"
    [[ ${STEP_RESULTS[$i]} == FAIL ]] && failed=$((failed + 1))
  done
  echo "total $(( SECONDS - T0 ))s; logs in $OUT_DIR"
  if [[ -f $OUT_DIR/bench.log ]] && grep -q '^### flashmsa benchmark table' "$OUT_DIR/bench.log"; then
    echo
    sed -n '/^### flashmsa benchmark table/,$p' "$OUT_DIR/bench.log" | grep -vE '^\[bench\]|^Traceback|^  '
  fi
  echo
  (( failed == 0 )) && echo "gpu_check: PASS" || echo "gpu_check: FAIL ($failed step(s) failed)"
} >"$OUT_DIR/summary.txt"
echo
cat "$OUT_DIR/summary.txt"
(( failed == 0 ))
