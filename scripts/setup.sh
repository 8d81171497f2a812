#!/usr/bin/env bash
# Installs flashmsa and everything it needs on a fresh machine (Linux, Python >= 3.10):
# PyPI packages it lacks (torch, numpy, build tools; the pinned nvidia-cutlass headers when nvcc is
# present), then the package itself, built with CUDA kernels for sm_80 and sm_90a when nvcc is
# found, else CPU-only. Environment:
#   FLASHMSA_ENABLE_CUDA=ON|OFF|AUTO   (default AUTO: CUDA when nvcc is on PATH)
#   FLASHMSA_BUILD_DIR=<dir>           persistent build dir for incremental rebuilds (default build/py)
#   FLASHMSA_OFFLINE=1                 install no packages (a machine without an index)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
cuda=${FLASHMSA_ENABLE_CUDA:-AUTO}
if [[ "$cuda" == AUTO ]]; then
  if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then cuda=ON; else cuda=OFF; fi
fi
[[ -x /usr/local/cuda/bin/nvcc ]] && export PATH="$PATH:/usr/local/cuda/bin"

need=()
$PY -c "import torch" 2>/dev/null || need+=("torch")
for mod_pkg in numpy:numpy tqdm:tqdm pytest:pytest scikit_build_core:scikit-build-core ninja:ninja; do
  $PY -c "import ${mod_pkg%%:*}" 2>/dev/null || need+=("${mod_pkg##*:}")
done
if [[ "$cuda" == ON ]] && ! $PY -c "import cutlass_library" 2>/dev/null && [[ -z "${FLASHMSA_CUTLASS_DIR:-}" ]]; then
  need+=("nvidia-cutlass==4.2.0.0")
fi
if ((${#need[@]})); then
  if [[ "${FLASHMSA_OFFLINE:-0}" == 1 ]]; then
    echo "setup: missing ${need[*]} and FLASHMSA_OFFLINE=1" >&2; exit 1
  fi
  echo "setup: installing ${need[*]}"
  $PY -m pip install -q "${need[@]}"
fi

args=(-C "cmake.define.FLASHMSA_ENABLE_CUDA=$cuda" -C "build-dir=${FLASHMSA_BUILD_DIR:-build/py}")
[[ -n "${FLASHMSA_CUTLASS_DIR:-}" ]] && args+=(-C "cmake.define.FLASHMSA_CUTLASS_DIR=$FLASHMSA_CUTLASS_DIR")
echo "setup: building flashmsa (CUDA kernels: $cuda)"
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
  $PY -m pip install --no-build-isolation --no-deps ${PIP_VERBOSE:+-v} "${args[@]}" .
$PY -c "import flashmsa, flashmsa._C; print('setup: flashmsa', flashmsa.__version__, 'CUDA kernels:', flashmsa.built_with_cuda())"
