# The installed C++ package (component "flashmsa_dev", never part of the Python wheel):
#   <prefix>/include/flashmsa/...                   public headers and flashmsa/reference/
#   <prefix>/lib/libmsa_core.a, libmsa_reference.a  static libraries
#   <prefix>/lib/cmake/flashmsa/                    flashmsaConfig.cmake: find_package(flashmsa)
# giving flashmsa::flashmsa, flashmsa::reference and flashmsa::headers (examples/cpp uses it).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(msa_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/flashmsa)
install(TARGETS msa_headers msa_reference msa_core EXPORT flashmsaTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT flashmsa_dev)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/flashmsa ${PROJECT_SOURCE_DIR}/reference/include/flashmsa
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT flashmsa_dev FILES_MATCHING PATTERN "*.h")
install(EXPORT flashmsaTargets NAMESPACE flashmsa:: DESTINATION ${msa_cmake_dir}
        COMPONENT flashmsa_dev)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/flashmsaConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/flashmsaConfig.cmake INSTALL_DESTINATION ${msa_cmake_dir})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/flashmsaConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flashmsaConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/flashmsaConfigVersion.cmake
        DESTINATION ${msa_cmake_dir} COMPONENT flashmsa_dev)
