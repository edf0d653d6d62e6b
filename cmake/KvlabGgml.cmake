# Finds the ggml engine of the ggml backend (kernels/ggml): ggml-base and ggml-cpu as
# tools/ggml/engine.sh builds them from the pinned llama-cpp-python sdist into
# build/ggml-engine/install (static libraries and ggml's CMake package config).
#
# KVLAB_WITH_GGML: AUTO (default) builds the backend when the engine is there and records
# why not otherwise; ON makes absence a configure error; OFF never builds it. The reason
# it is absent is compiled into the harness, so `--backend ggml` is a skip naming it.
set(KVLAB_WITH_GGML AUTO CACHE STRING "Build the ggml backend against build/ggml-engine (AUTO, ON, OFF)")
set_property(CACHE KVLAB_WITH_GGML PROPERTY STRINGS AUTO ON OFF)
set(KVLAB_GGML_ROOT "${PROJECT_SOURCE_DIR}/build/ggml-engine" CACHE PATH
    "Where tools/ggml/engine.sh puts the ggml engine (install/ inside, or the file unavailable)")

set(KVLAB_GGML_FOUND OFF)
set(KVLAB_GGML_ABSENT_REASON "")
if(KVLAB_WITH_GGML STREQUAL "OFF")
  set(KVLAB_GGML_ABSENT_REASON "the ggml backend is off in this build (KVLAB_WITH_GGML=OFF)")
else()
  set(kvlab_ggml_config_dir "${KVLAB_GGML_ROOT}/install/lib/cmake/ggml")
  if(EXISTS "${kvlab_ggml_config_dir}/ggml-config.cmake")
    # ggml's imported targets require c_std_11 (a compile feature of the C language).
    enable_language(C)
    find_package(ggml CONFIG QUIET PATHS "${kvlab_ggml_config_dir}" NO_DEFAULT_PATH)
  endif()
  if(ggml_FOUND AND TARGET ggml::ggml-cpu)
    set(KVLAB_GGML_FOUND ON)
    message(STATUS "kvlab: ggml backend against ${KVLAB_GGML_ROOT}/install (ggml ${ggml_VERSION})")
  else()
    if(EXISTS "${KVLAB_GGML_ROOT}/unavailable")  # tools/ggml/engine.sh writes why
      file(READ "${KVLAB_GGML_ROOT}/unavailable" kvlab_why)
      string(STRIP "${kvlab_why}" kvlab_why)
      set(KVLAB_GGML_ABSENT_REASON "no ggml engine: ${kvlab_why}")
    else()
      set(KVLAB_GGML_ABSENT_REASON "no ggml engine in ${KVLAB_GGML_ROOT}/install (run tools/setup.sh or tools/ggml/engine.sh)")
    endif()
    if(KVLAB_WITH_GGML STREQUAL "ON")
      message(FATAL_ERROR "KVLAB_WITH_GGML=ON: ${KVLAB_GGML_ABSENT_REASON}")
    endif()
    message(STATUS "kvlab: ggml backend skipped: ${KVLAB_GGML_ABSENT_REASON}")
  endif()
endif()

# llama.cpp's library, built beside ggml by the same script (tools/ggml/engine.sh): the
# llama.cpp replays (adapters/llama) link it. Absent (an engine built before it was
# added, or a failed build) → the replays are not built and their tests skip naming why.
set(KVLAB_LLAMA_FOUND OFF)
set(KVLAB_LLAMA_ABSENT_REASON "${KVLAB_GGML_ABSENT_REASON}")
if(KVLAB_GGML_FOUND)
  set(kvlab_llama_config_dir "${KVLAB_GGML_ROOT}/install/lib/cmake/llama")
  if(EXISTS "${kvlab_llama_config_dir}/llama-config.cmake")
    find_package(llama CONFIG QUIET PATHS "${kvlab_llama_config_dir}" NO_DEFAULT_PATH)
  endif()
  if(llama_FOUND AND TARGET llama)
    set(KVLAB_LLAMA_FOUND ON)
    message(STATUS "kvlab: llama.cpp replays against ${KVLAB_GGML_ROOT}/install")
  else()
    set(KVLAB_LLAMA_ABSENT_REASON "no llama library in ${KVLAB_GGML_ROOT}/install (run tools/ggml/engine.sh)")
    message(STATUS "kvlab: llama.cpp replays skipped: ${KVLAB_LLAMA_ABSENT_REASON}")
  endif()
endif()
