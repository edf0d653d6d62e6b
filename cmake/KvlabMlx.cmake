# Finds the pinned MLX of the project's Python venv (tools/setup_venv.sh: build/venv)
# for the MLX backend (kernels/mlx). The wheel ships MLX's C++ headers, libmlx.so and a
# CMake package config under site-packages/mlx/share/cmake/MLX.
#
# KVLAB_WITH_MLX: AUTO (default) builds the backend when the venv has MLX and records
# why not otherwise; ON makes absence a configure error; OFF never builds it. The reason
# it is absent is compiled into the harness, so `--backend mlx` is a skip naming it.
set(KVLAB_WITH_MLX AUTO CACHE STRING "Build the MLX backend against the venv's MLX (AUTO, ON, OFF)")
set_property(CACHE KVLAB_WITH_MLX PROPERTY STRINGS AUTO ON OFF)
set(KVLAB_MLX_VENV "${PROJECT_SOURCE_DIR}/build/venv" CACHE PATH "The Python venv holding the pinned mlx wheel")

set(KVLAB_MLX_FOUND OFF)
set(KVLAB_MLX_ABSENT_REASON "")
if(KVLAB_WITH_MLX STREQUAL "OFF")
  set(KVLAB_MLX_ABSENT_REASON "the MLX backend is off in this build (KVLAB_WITH_MLX=OFF)")
else()
  file(GLOB kvlab_mlx_config_dirs "${KVLAB_MLX_VENV}/lib/python3*/site-packages/mlx/share/cmake/MLX")
  list(LENGTH kvlab_mlx_config_dirs kvlab_mlx_n)
  if(kvlab_mlx_n GREATER 0)
    list(GET kvlab_mlx_config_dirs 0 kvlab_mlx_config_dir)
    find_package(MLX CONFIG QUIET PATHS "${kvlab_mlx_config_dir}" NO_DEFAULT_PATH)
  endif()
  if(MLX_FOUND AND TARGET mlx)
    set(KVLAB_MLX_FOUND ON)
    get_filename_component(KVLAB_MLX_SITE "${kvlab_mlx_config_dir}/../../../.." ABSOLUTE)
    message(STATUS "kvlab: MLX backend against ${KVLAB_MLX_SITE}/mlx (MLX ${MLX_VERSION})")
  else()
    set(kvlab_unavailable "${KVLAB_MLX_VENV}.unavailable")  # tools/setup_venv.sh writes why
    if(EXISTS "${kvlab_unavailable}")
      file(READ "${kvlab_unavailable}" kvlab_why)
      string(STRIP "${kvlab_why}" kvlab_why)
      set(KVLAB_MLX_ABSENT_REASON "no MLX venv: ${kvlab_why}")
    else()
      set(KVLAB_MLX_ABSENT_REASON "no MLX in ${KVLAB_MLX_VENV} (run tools/setup.sh)")
    endif()
    if(KVLAB_WITH_MLX STREQUAL "ON")
      message(FATAL_ERROR "KVLAB_WITH_MLX=ON: ${KVLAB_MLX_ABSENT_REASON}")
    endif()
    message(STATUS "kvlab: MLX backend skipped: ${KVLAB_MLX_ABSENT_REASON}")
  endif()
endif()
