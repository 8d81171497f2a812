#!/usr/bin/env bash
# Every mode of mbarrier_patterns.cu under compute-sanitizer synccheck, one line each:
#   mode N: <its own check> | <synccheck reports> (the lines of mbarrier_patterns.cu they point at)
# Needs nvcc and an sm_90 GPU. Usage: bash tests/sanitizer/run_mbarrier_patterns.sh [BUILD_DIR]
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:-${TMPDIR:-/tmp}/flashmsa-mbarrier-patterns}
mkdir -p "$build"
[[ -d /usr/local/cuda/bin ]] && export PATH="$PATH:/usr/local/cuda/bin"
CS=${COMPUTE_SANITIZER:-compute-sanitizer}
nvcc -std=c++17 -arch=sm_90a -lineinfo -o "$build/mbarrier_patterns" "$here/mbarrier_patterns.cu" || exit 1
status=0
for mode in 0 1 2 3 4 5 6 7 8; do
  log=$("$CS" --tool synccheck --print-limit 100000 --show-backtrace device "$build/mbarrier_patterns" "$mode" 2>&1)
  own=$(grep "^mode $mode:" <<<"$log")
  [[ $own == *" 0 of "* && $own == *"no error"* ]] || status=1
  n=$(grep -c "Barrier error" <<<"$log")
  where=$(grep -o "mbarrier_patterns.cu:[0-9]*" <<<"$log" | sort | uniq -c | awk '{printf "%s x%s ", $2, $1}')
  echo "$own | synccheck: $n report(s) ${where}"
done
# With KERNEL_FILTER (gpu_check's SANITIZER_KERNEL_FILTER, e.g. kns=flashmsa): mode 0 under that
# --kernel-name filter and under one that names no kernel. Its kernel lives in namespace flashmsa
# like the library's, so a filter that selects the library's kernels still reports it; a filter
# that selects nothing must report nothing.
if [[ -n ${KERNEL_FILTER:-} ]]; then
  for f in "$KERNEL_FILTER" kns=no_such_kernel; do
    log=$("$CS" --tool synccheck --kernel-name "$f" --print-limit 100000 "$build/mbarrier_patterns" 0 2>&1)
    echo "filter $f: mode 0 under synccheck: $(grep -c "Barrier error" <<<"$log") report(s)"
  done
fi
exit $status
