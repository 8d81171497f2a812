#!/usr/bin/env bash
# Every mode of initcheck_tma_store.cu under compute-sanitizer initcheck, one line each:
#   mode N (<how the buffer was written>): <its own check> | initcheck: <reports>
# Mode 0 (st.global) must report nothing and mode 3 (nothing written) must report the reads;
# modes 1 and 2 say whether initcheck counts TMA / bulk stores as writes.
# Needs nvcc (NVCC) and an sm_90 GPU. Usage: bash tests/sanitizer/run_initcheck_tma_store.sh [BUILD_DIR]
# scripts/gpu_check.sh runs it before initcheck's shards and, where mode 1 is reported (and the
# controls hold), runs the smoke with --no-tma-stores (benchmarks/sanitize_smoke.py).
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:-${TMPDIR:-/tmp}/flashmsa-initcheck-tma-store}
mkdir -p "$build"
[[ -d /usr/local/cuda/bin ]] && export PATH="$PATH:/usr/local/cuda/bin"
CS=${COMPUTE_SANITIZER:-compute-sanitizer}
"${NVCC:-nvcc}" -std=c++17 -arch=sm_90a -lineinfo -o "$build/initcheck_tma_store" "$here/initcheck_tma_store.cu" -lcuda ||
  exit 1
status=0
for mode in 0 1 2 3; do
  log=$("$CS" --tool initcheck --print-limit 100000 "$build/initcheck_tma_store" "$mode" 2>&1)
  own=$(grep "^mode $mode" <<<"$log")
  [[ -n $own && $own != *"WRONG"* ]] || status=1
  n=$(grep -c "Uninitialized __global__ memory read" <<<"$log")
  echo "$own | initcheck: $n report(s)"
  if [[ $mode == 0 && $n != 0 ]] || [[ $mode == 3 && $n == 0 ]]; then status=1; fi
done
exit $status
