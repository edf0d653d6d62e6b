# `cmake --install <build> --prefix P`: the static libraries and the CMake package
# (find_package(kvlab): namespaced targets kvlab::core, ::reference, ::cache, ::simd,
# ::vulkan, ::mlx, ::ggml and ::harness, as built), the public headers in kvlab's own layout
# (P/include/{kvlab,harness,reference,cache}), the kvlab CLI and kvlab_bench (P/bin), and
# the case files (P/share/kvlab/cases, P/share/kvlab/known) and the golden folder
# (P/share/kvlab/golden), which installed binaries find beside themselves
# (harness/check.h default_cases_dir, tools/kvlab/golden_select.h default_golden_dir). examples/downstream uses
# the package; tools/test_install.sh (CTest install.downstream) proves it.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(kvlab_export_targets)
foreach(name IN ITEMS core reference cache simd vulkan mlx ggml harness)
  if(TARGET kvlab_${name})
    set_target_properties(kvlab_${name} PROPERTIES EXPORT_NAME ${name})
    list(APPEND kvlab_export_targets kvlab_${name})
  endif()
endforeach()
# Recorded for kvlabConfig.cmake: which optional libraries are exported, and where the
# MLX package is (an installed kvlab::mlx links the venv's libmlx where it was built).
set(KVLAB_EXPORT_SIMD OFF)
set(KVLAB_EXPORT_VULKAN OFF)
set(KVLAB_EXPORT_MLX OFF)
set(KVLAB_EXPORT_GGML OFF)
if(TARGET kvlab_simd)
  set(KVLAB_EXPORT_SIMD ON)
endif()
if(TARGET kvlab_vulkan)
  set(KVLAB_EXPORT_VULKAN ON)
endif()
if(TARGET kvlab_mlx)
  set(KVLAB_EXPORT_MLX ON)
endif()
if(TARGET kvlab_ggml)  # kvlab::ggml links the static ggml of KVLAB_GGML_ROOT where it was built
  set(KVLAB_EXPORT_GGML ON)
  set(kvlab_ggml_config_dir "${KVLAB_GGML_ROOT}/install/lib/cmake/ggml")
endif()

install(TARGETS ${kvlab_export_targets} EXPORT kvlabTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
set(kvlab_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/kvlab)
install(EXPORT kvlabTargets NAMESPACE kvlab:: DESTINATION ${kvlab_cmake_dir} FILE kvlabTargets.cmake)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvlabConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/kvlabConfig.cmake
                              INSTALL_DESTINATION ${kvlab_cmake_dir})
# 0.x: a minor version may break the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvlabConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvlabConfig.cmake ${PROJECT_BINARY_DIR}/kvlabConfigVersion.cmake
        DESTINATION ${kvlab_cmake_dir})

# Headers: every header of include/kvlab, harness (with harness/ops), reference and
# cache; together they include nothing else of kvlab (only xtensor, from kvlab/tensor.h).
# A *_internal.h header is shared by a library's own sources only and stays behind.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kvlab DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
foreach(dir IN ITEMS harness harness/ops reference cache)
  file(GLOB kvlab_headers CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${dir}/*.h)
  list(FILTER kvlab_headers EXCLUDE REGEX "_internal\\.h$")
  install(FILES ${kvlab_headers} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${dir})
endforeach()

if(KVLAB_WITH_HARNESS)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/harness/cases/ DESTINATION ${CMAKE_INSTALL_DATADIR}/kvlab/cases)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/harness/known/ DESTINATION ${CMAKE_INSTALL_DATADIR}/kvlab/known)
  # What `kvlab golden` reads (--golden-dir): the models' configs and hashes, the
  # scenarios, the checked-in goldens and the registers. An installed kvlab finds them
  # beside itself (tools/kvlab/golden_select.h) and generates model folders in a per-user
  # cache, never in the prefix.
  foreach(dir IN ITEMS models scenarios data known)
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/golden/${dir}/ DESTINATION ${CMAKE_INSTALL_DATADIR}/kvlab/golden/${dir})
  endforeach()
  set(kvlab_install_programs kvlab)
  if(TARGET kvlab_bench)
    list(APPEND kvlab_install_programs kvlab_bench)
  endif()
  # Installed binaries keep the run path of the venv's libmlx when the MLX backend is
  # built (system libraries need none). Named explicitly: INSTALL_RPATH_USE_LINK_PATH
  # leaves out directories inside the source tree, which is where tools/setup_venv.sh
  # puts the venv (build/venv).
  if(TARGET kvlab_mlx)
    get_target_property(kvlab_mlx_lib mlx IMPORTED_LOCATION_RELEASE)
    if(NOT kvlab_mlx_lib)
      get_target_property(kvlab_mlx_lib mlx IMPORTED_LOCATION)
    endif()
    get_filename_component(kvlab_mlx_lib_dir "${kvlab_mlx_lib}" DIRECTORY)
    set_target_properties(${kvlab_install_programs} PROPERTIES INSTALL_RPATH "${kvlab_mlx_lib_dir}")
  endif()
  install(TARGETS ${kvlab_install_programs} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
