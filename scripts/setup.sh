#!/usr/bin/env bash
# Brings a Linux machine with Python >= 3.10 to a working flashmsa install (the CUDA toolkit is
# optional). Steps, each printed with its time:
#   1. Python packages it lacks, from PyPI: torch, numpy, tqdm, pytest, scikit-build-core, ninja, and
#      CMake when no cmake >= 3.25 is on PATH; pip itself first when it is older than 23.1
#   2. with --tests (the test command): GoogleTest for the C++ tests, from the distribution's
#      packages (apt-get / dnf) when it is missing; where that cannot run, a message naming the
#      package (the Python install still completes)
#   3. the package itself: pip install --no-build-isolation . (scikit-build-core over CMake, against
#      the torch installed here), with CUDA kernels when nvcc is found, else CPU-only; the compile
#      steps are shown as they run, the whole log is kept in build/setup-build.log
#
# Environment:
#   FLASHMSA_ENABLE_CUDA=ON|OFF|AUTO  default AUTO: CUDA kernels when nvcc is on PATH or in
#                                     /usr/local/cuda/bin
#   FLASHMSA_CUDA_ARCHS="80;90a"      CUDA architectures to compile (CMake list syntax), default
#                                     "80;90a": sm_80 runs everywhere from Ampere up, sm_90a adds
#                                     Hopper's kernels; e.g. "90a" for Hopper only (faster build)
#   FLASHMSA_BUILD_DIR=<dir>          persistent build dir for incremental rebuilds (default build/py)
#   FLASHMSA_OFFLINE=1                install nothing (a machine without a package index)
#   FLASHMSA_VERBOSE=1                show the whole build output
#   PYTHON=python3                    the interpreter to install into
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
# An absolute path: the PATH change below (a cmake from PyPI first) must not switch interpreters
# (with /usr/bin first, "python3" would be the system's, without torch).
PY=$(command -v "${PYTHON:-python3}") || { echo "setup: no ${PYTHON:-python3} on PATH" >&2; exit 1; }
with_tests=0
for arg in "$@"; do
  case $arg in
    --tests) with_tests=1 ;;
    *) echo "usage: $0 [--tests]" >&2; exit 2 ;;
  esac
done
steps=$((2 + with_tests))
step=0
begin_step() { step=$((step + 1)); step_start=$SECONDS; echo "setup [$step/$steps] $*"; }
end_step() { echo "setup [$step/$steps] done in $(msa_elapsed "$step_start")"; }

if ! $PY -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
  echo "setup: flashmsa needs Python >= 3.10 ($PY is $($PY --version 2>&1))" >&2
  exit 1
fi

cuda=${FLASHMSA_ENABLE_CUDA:-AUTO}
[[ -x /usr/local/cuda/bin/nvcc ]] && ! command -v nvcc >/dev/null 2>&1 && export PATH="$PATH:/usr/local/cuda/bin"
if [[ "$cuda" == AUTO ]]; then
  if command -v nvcc >/dev/null 2>&1; then cuda=ON; else cuda=OFF; fi
fi

# ---- 1. Python packages -----------------------------------------------------------------------
begin_step "Python packages"
# module:package pairs; find_spec looks for a module without importing it (torch takes seconds).
wanted=(torch:torch numpy:numpy tqdm:tqdm pytest:pytest scikit_build_core:scikit-build-core ninja:ninja)
read -r -a need <<<"$($PY -c '
import importlib.util, sys
print(" ".join(p.split(":", 1)[1] for p in sys.argv[1:]
               if importlib.util.find_spec(p.split(":", 1)[0]) is None))' "${wanted[@]}")"
msa_find_cmake "$PY" >/dev/null || need+=("cmake>=$FLASHMSA_MIN_CMAKE")
$PY -m pip --version >/dev/null 2>&1 || {
  echo "setup: $PY has no pip: make a virtual environment (python3 -m venv) or run $PY -m ensurepip" >&2
  exit 1; }
# The build step passes -C (pip >= 23.1); a venv of Debian 12's python3 comes with pip 23.0.1.
old_pip=0
$PY -c 'import pip, re, sys; sys.exit(tuple(map(int, re.match(r"(\d+)\.(\d+)", pip.__version__).groups())) < (23, 1))' \
  2>/dev/null || old_pip=1
((old_pip)) && need=("pip>=23.1" "${need[@]}")
if ((${#need[@]})); then
  if [[ "${FLASHMSA_OFFLINE:-0}" == 1 ]]; then
    echo "setup: missing ${need[*]} and FLASHMSA_OFFLINE=1" >&2; exit 1
  fi
  case " ${need[*]} " in
    *" torch "*) echo "setup: installing ${need[*]} from PyPI (torch with its CUDA libraries is several GB: minutes)" ;;
    *) echo "setup: installing ${need[*]} from PyPI" ;;
  esac
  if ((old_pip)); then  # pip first, on its own: the rest then installs with the new one
    $PY -m pip install --progress-bar on "${need[0]}"
    need=("${need[@]:1}")
  fi
  ((${#need[@]} == 0)) || $PY -m pip install --progress-bar on "${need[@]}"
else
  echo "setup: pip, torch, numpy, tqdm, pytest, scikit-build-core, ninja and CMake are installed"
fi
cmake_bin=$(msa_find_cmake "$PY") || {
  echo "setup: no cmake >= $FLASHMSA_MIN_CMAKE after installing it from PyPI" >&2; exit 1; }
# The build finds the same cmake (prepended only when PATH would find another one).
[[ "$(command -v cmake 2>/dev/null)" == "$cmake_bin" ]] || export PATH="$(dirname "$cmake_bin"):$PATH"
echo "setup: $("$cmake_bin" --version | head -1) ($cmake_bin)"
end_step

# ---- 2. GoogleTest (only for the test command) ------------------------------------------------
if ((with_tests)); then
  begin_step "GoogleTest for the C++ tests"
  if msa_have_gtest; then
    echo "setup: GoogleTest found"
  else
    sudo=()
    if ((EUID != 0)) && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo=(sudo -n); fi
    if [[ "${FLASHMSA_OFFLINE:-0}" == 1 ]]; then
      echo "setup: FLASHMSA_OFFLINE=1 and $MSA_GTEST_HINT" >&2
    elif ((EUID != 0 && ${#sudo[@]} == 0)); then
      echo "setup: not root and no password-less sudo, so nothing is installed; $MSA_GTEST_HINT" >&2
    elif command -v apt-get >/dev/null 2>&1; then
      echo "setup: installing libgtest-dev with apt-get"
      export DEBIAN_FRONTEND=noninteractive
      "${sudo[@]}" apt-get install -y -q --no-install-recommends libgtest-dev \
        || { "${sudo[@]}" apt-get update -q && "${sudo[@]}" apt-get install -y -q --no-install-recommends libgtest-dev; } \
        || echo "setup: apt-get could not install libgtest-dev; $MSA_GTEST_HINT" >&2
    elif command -v dnf >/dev/null 2>&1; then
      echo "setup: installing gtest-devel with dnf"
      "${sudo[@]}" dnf install -y -q gtest-devel || echo "setup: dnf could not install gtest-devel; $MSA_GTEST_HINT" >&2
    else
      echo "setup: no apt-get or dnf here; $MSA_GTEST_HINT" >&2
    fi
  fi
  end_step
fi

# ---- 3. the package ---------------------------------------------------------------------------
archs=${FLASHMSA_CUDA_ARCHS:-80;90a}
if [[ "$cuda" == ON ]]; then what="CUDA kernels for $archs"; else what="CPU only: no nvcc"; fi
[[ "${FLASHMSA_ENABLE_CUDA:-AUTO}" == OFF ]] && what="CPU only: FLASHMSA_ENABLE_CUDA=OFF"
mkdir -p build
log=build/setup-build.log
jobs=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
begin_step "building flashmsa ($what, $jobs parallel jobs; log: $log)"
[[ "$cuda" == ON ]] && echo "setup: compiling the CUDA kernels takes minutes (the [n/N] lines count the steps)"
args=(-C "cmake.define.FLASHMSA_ENABLE_CUDA=$cuda" -C "cmake.define.FLASHMSA_CUDA_ARCHS=$archs"
      -C "build-dir=${FLASHMSA_BUILD_DIR:-build/py}")
build=(env CMAKE_BUILD_PARALLEL_LEVEL="$jobs"
       $PY -m pip install --no-build-isolation --no-deps -v "${args[@]}" .)
if [[ "${FLASHMSA_VERBOSE:-${PIP_VERBOSE:-0}}" != 0 ]]; then
  "${build[@]}" 2>&1 | tee "$log"
else
  # Progress: ninja's [n/N] steps, flashmsa's configure lines, compiler / ptxas warnings and
  # errors (register spills included), and CMake warnings / errors whole. A loop of bash's read,
  # not awk: mawk (Debian's awk) reads a pipe in blocks, so the steps showed up only kilobytes late.
  progress() {
    local line block=0
    while IFS= read -r line; do
      [[ $line =~ CMake\ (Warning|Error) ]] && block=1
      if ((block)); then
        printf '%s\n' "$line"
        [[ $line =~ ^[[:space:]]*$ ]] && block=0
      elif [[ $line =~ ^\ *--\ flashmsa: || $line =~ ^\ *\[[0-9]+/[0-9]+\] || ${line,,} =~ warning|error ]]; then
        printf '%s\n' "$line"
      fi
    done
    return 0
  }
  if ! "${build[@]}" 2>&1 </dev/null | tee "$log" | progress; then
    echo "setup: the build failed; the end of $log:" >&2
    tail -n 60 "$log" >&2
    exit 1
  fi
fi
end_step
$PY -c "import flashmsa, flashmsa._C; print('setup: flashmsa', flashmsa.__version__, 'CUDA kernels:', flashmsa.built_with_cuda())"
echo "setup: done ('flashmsa info' shows what was built)"
