# msa_find_cutlass(<out-var>): the include dir holding cute/ and cutlass/. Order: the
# FLASHMSA_CUTLASS_DIR cache variable, then the nvidia-cutlass wheel of the Python interpreter CMake
# finds (<site-packages>/cutlass_library/source/include). Never vendored.
function(msa_find_cutlass out)
  set(dir "${FLASHMSA_CUTLASS_DIR}")
  if(NOT dir)
    find_package(Python3 COMPONENTS Interpreter QUIET)
    if(Python3_FOUND)
      execute_process(
        COMMAND ${Python3_EXECUTABLE} -c
          "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))"
        OUTPUT_VARIABLE dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    endif()
  endif()
  if(NOT dir OR NOT EXISTS "${dir}/cute/tensor.hpp")
    message(FATAL_ERROR "CUTLASS/CuTe headers not found: `pip install nvidia-cutlass==4.2.0.0` or set "
                        "-DFLASHMSA_CUTLASS_DIR=<dir containing cute/ and cutlass/> (looked at '${dir}')")
  endif()
  message(STATUS "flashmsa: CUTLASS headers in ${dir}")
  set(${out} "${dir}" PARENT_SCOPE)
endfunction()

# msa_add_gtest(<name> SOURCES <files...> [LIBS <targets...>]): a GoogleTest executable linked with
# the test helpers (and so the reference) plus LIBS, registered with CTest test by test.
function(msa_add_gtest name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES} ${PROJECT_SOURCE_DIR}/tests/cpp/test_main.cpp)
  target_link_libraries(${name} PRIVATE msa_test_support ${ARG_LIBS})
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 120 PROPERTIES TIMEOUT 900)
endfunction()
