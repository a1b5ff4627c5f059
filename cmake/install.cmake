# `cmake --install` gives find_package(flashattn) -> flashattn::flashattn, and flashattn.pc.
include(CMakePackageConfigHelpers)
install(TARGETS flashattn EXPORT flashattnTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/flashattn DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT flashattnTargets NAMESPACE flashattn:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flashattn)
configure_package_config_file(cmake/flashattnConfig.cmake.in ${PROJECT_BINARY_DIR}/flashattnConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flashattn)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flashattnConfigVersion.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/flashattnConfig.cmake ${PROJECT_BINARY_DIR}/flashattnConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/flashattn)
file(RELATIVE_PATH FLASHATTN_PC_PREFIX_FROM_PCDIR /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
configure_file(cmake/flashattn.pc.in ${PROJECT_BINARY_DIR}/flashattn.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/flashattn.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(FLASHATTN_BUILD_CLI AND TARGET flashattn_cli)
  install(TARGETS flashattn_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
