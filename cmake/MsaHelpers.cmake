# msa_add_gtest(<name> SOURCES <files...> [LIBS <targets...>]): a GoogleTest executable linked with
# the test helpers (and so the reference) plus LIBS, registered with CTest test by test.
function(msa_add_gtest name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES} ${PROJECT_SOURCE_DIR}/tests/cpp/test_main.cpp)
  target_link_libraries(${name} PRIVATE msa_test_support ${ARG_LIBS})
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 120 PROPERTIES TIMEOUT 900)
endfunction()
