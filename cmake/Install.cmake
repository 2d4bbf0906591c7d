# Installs the public headers, the library and a CMake package, so that
#   find_package(pagedmha CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE pagedmha::pagedmha)
# works against the prefix (lib/cmake/pagedmha). Component `pagedmha`; the Python
# extension is component `python` (python/CMakeLists.txt).
include(CMakePackageConfigHelpers)

set(PAGEDMHA_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/pagedmha)
install(TARGETS pagedmha EXPORT pagedmhaTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT pagedmha
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT pagedmha
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT pagedmha)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/pagedmha DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT pagedmha FILES_MATCHING PATTERN "*.h")
install(EXPORT pagedmhaTargets NAMESPACE pagedmha:: DESTINATION ${PAGEDMHA_INSTALL_CMAKEDIR}
        COMPONENT pagedmha)

# What the config needs to find again: OpenMP always, the CUDA runtime in a CUDA build.
set(PAGEDMHA_PACKAGE_WITH_CUDA ${PAGEDMHA_WITH_CUDA})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/pagedmhaConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/pagedmhaConfig.cmake
                              INSTALL_DESTINATION ${PAGEDMHA_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/pagedmhaConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/pagedmhaConfig.cmake ${PROJECT_BINARY_DIR}/pagedmhaConfigVersion.cmake
        DESTINATION ${PAGEDMHA_INSTALL_CMAKEDIR} COMPONENT pagedmha)
