#!/usr/bin/env bash
# Runs every test that this machine can run: the C++ suites (GoogleTest through CTest: reference vs
# brute-force oracles, validation), the C++ package example (examples/cpp built against an install
# of the package) and the Python suite (pytest; GPU tests run where CUDA is, and are reported as
# skipped elsewhere). Installs what is missing first (scripts/setup.sh --tests).
# Environment: SKIP_SETUP=1 (package already installed), CTEST_ARGS, PYTEST_ARGS.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
jobs=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
status=0

source scripts/common.sh

if [[ "${SKIP_SETUP:-0}" != 1 ]]; then
  bash scripts/setup.sh --tests || exit 1
fi
# setup.sh may have installed CMake from PyPI, outside PATH.
cmake=$(msa_find_cmake "$PY") || { echo "no cmake >= $FLASHMSA_MIN_CMAKE: run scripts/setup.sh" >&2; exit 1; }
ctest=$(dirname "$cmake")/ctest

echo "== C++ tests =="
# The C++ suites test the torch-free core and reference; the CUDA sources are compiled by the
# package build above, so this build skips them to save CI time.
mkdir -p build
cpp_tests=ON
if ! msa_have_gtest; then
  echo "C++ tests not run: $MSA_GTEST_HINT" >&2
  status=1
  cpp_tests=OFF  # still build the libraries for the package example below
fi
cpp_built=0
if ! "$cmake" -S . -B build/cpp -G Ninja -DFLASHMSA_ENABLE_CUDA=OFF -DFLASHMSA_BUILD_TESTS=$cpp_tests \
     ${FLASHMSA_GTEST_SOURCE_DIR:+-DFLASHMSA_GTEST_SOURCE_DIR="$FLASHMSA_GTEST_SOURCE_DIR"} \
     >build/cpp-configure.log 2>&1; then
  cat build/cpp-configure.log
  status=1
elif ! "$cmake" --build build/cpp -j "$jobs"; then
  status=1
else
  cpp_built=1
  if [[ $cpp_tests == ON ]]; then
    (cd build/cpp && "$ctest" --output-on-failure -j "$jobs" ${CTEST_ARGS:-}) || status=1
  fi
fi

echo "== C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer =="
# The same suites built with FLASHMSA_SANITIZE=address,undefined (no recovery: a finding fails
# its test). On in CI (CI=true) and with FLASHMSA_TEST_SANITIZE=1; ~3 min on 2 cores.
if [[ "${FLASHMSA_TEST_SANITIZE:-${CI:-0}}" =~ ^(1|true|yes|on)$ ]]; then
  if [[ $cpp_tests != ON ]]; then
    echo "not run: no GoogleTest"
  elif ! "$cmake" -S . -B build/cpp-sanitize -G Ninja -DFLASHMSA_ENABLE_CUDA=OFF -DFLASHMSA_BUILD_TESTS=ON \
       -DFLASHMSA_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=RelWithDebInfo \
       ${FLASHMSA_GTEST_SOURCE_DIR:+-DFLASHMSA_GTEST_SOURCE_DIR="$FLASHMSA_GTEST_SOURCE_DIR"} \
       >build/cpp-sanitize-configure.log 2>&1; then
    cat build/cpp-sanitize-configure.log
    status=1
  elif ! "$cmake" --build build/cpp-sanitize -j "$jobs" >build/cpp-sanitize-build.log 2>&1; then
    tail -50 build/cpp-sanitize-build.log
    status=1
  else
    (cd build/cpp-sanitize && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
       "$ctest" --output-on-failure -j "$jobs" ${CTEST_ARGS:-}) || status=1
  fi
else
  echo "not run (set FLASHMSA_TEST_SANITIZE=1; CI runs it)"
fi

echo "== C++ package example =="
# Installs the C++ package of the build above (headers, static libraries, CMake config) to a
# temporary prefix, builds examples/cpp against it with find_package(flashmsa) and runs it (host
# memory: the CPU reference).
if ((cpp_built)); then
  prefix=$PWD/build/cpp-install
  rm -rf "$prefix" build/example
  if "$cmake" --install build/cpp --prefix "$prefix" >build/example.log 2>&1 \
     && "$cmake" -S examples/cpp -B build/example -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >>build/example.log 2>&1 \
     && "$cmake" --build build/example >>build/example.log 2>&1; then
    build/example/msa_pipeline || status=1
  else
    cat build/example.log
    status=1
  fi
  # The same project with flashmsa as a subproject: it must configure with the same target names
  # and without flashmsa's tests (configure only: the libraries were just built and run above).
  rm -rf build/example-subdir
  if ! "$cmake" -S examples/cpp -B build/example-subdir -G Ninja -DFLASHMSA_SOURCE_DIR="$PWD" \
       -DFLASHMSA_ENABLE_CUDA=OFF >build/example-subdir.log 2>&1; then
    cat build/example-subdir.log
    status=1
  elif grep -q "msa_test" build/example-subdir/build.ninja; then
    echo "examples/cpp with add_subdirectory(flashmsa) builds flashmsa's tests" >&2
    status=1
  else
    echo "examples/cpp also configures with add_subdirectory(flashmsa) (no tests, no install rules)"
  fi
else
  echo "not run: the C++ build failed"
fi

echo "== Python tests =="
$PY -m pytest tests/python -q -rs ${PYTEST_ARGS:-}
rc=$?
if [[ $rc == 5 ]]; then
  echo "pytest: no tests collected (not a failure)"
elif [[ $rc != 0 ]]; then
  status=1
fi
exit $status
