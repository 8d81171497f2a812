# Shell helpers shared by scripts/setup.sh and scripts/test.sh (sourced, not run).

FLASHMSA_MIN_CMAKE=3.25

# msa_cmake_ok <cmake>: <cmake> runs and is at least FLASHMSA_MIN_CMAKE.
msa_cmake_ok() {
  local v
  v=$("$1" --version 2>/dev/null | sed -n '1s/^cmake version \([0-9][0-9.]*\).*/\1/p')
  [[ -n $v ]] && printf '%s\n%s\n' "$FLASHMSA_MIN_CMAKE" "$v" | sort -V -C
}

# msa_find_cmake <python>: prints the path of a cmake >= FLASHMSA_MIN_CMAKE: the one on PATH, else
# the one of the `cmake` package from PyPI installed for <python>; fails when there is neither.
msa_find_cmake() {
  local c
  c=$(command -v cmake 2>/dev/null) && msa_cmake_ok "$c" && { echo "$c"; return 0; }
  c=$("$1" -c "import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, 'cmake'))" 2>/dev/null) \
    && msa_cmake_ok "$c" && { echo "$c"; return 0; }
  return 1
}

# msa_have_gtest: GoogleTest is where tests/cpp/CMakeLists.txt looks for it (an installed package,
# the Debian source tree /usr/src/googletest, or FLASHMSA_GTEST_SOURCE_DIR).
msa_have_gtest() {
  [[ -n ${FLASHMSA_GTEST_SOURCE_DIR:-} && -f $FLASHMSA_GTEST_SOURCE_DIR/CMakeLists.txt ]] && return 0
  [[ -f /usr/src/googletest/CMakeLists.txt ]] && return 0
  local d
  for d in /usr/include /usr/local/include ${CONDA_PREFIX:+"$CONDA_PREFIX/include"}; do
    [[ -f $d/gtest/gtest.h ]] && return 0
  done
  return 1
}

MSA_GTEST_HINT="GoogleTest is missing (the C++ tests need it): install your distribution's package \
(Debian / Ubuntu: libgtest-dev; Fedora / RHEL: gtest-devel; Arch: gtest; conda: gtest), or set \
FLASHMSA_GTEST_SOURCE_DIR to a GoogleTest source tree"

# msa_elapsed <start seconds>: "12 s" / "3 min 4 s" since <start>.
msa_elapsed() {
  local s=$((SECONDS - $1))
  if ((s >= 60)); then echo "$((s / 60)) min $((s % 60)) s"; else echo "$s s"; fi
}
