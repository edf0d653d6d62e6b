# One helper per artifact kind. Every kvlab target gets the same warnings and the
# sanitizer flags of the preset; tests are discovered per gtest case and labelled.

# -Wno-missing-field-initializers: op argument structs and packed-tensor descriptors are
# aggregates whose trailing members have defaults (e.g. QuantizedDTensor::global_scale);
# GCC 12 warns on every brace initializer that leaves them out.
set(KVLAB_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wsign-conversion
                   -Wold-style-cast -Wnon-virtual-dtor -Wno-missing-field-initializers)
# -Wno-restrict for GCC: at -O3 (the release preset) GCC 12 reports impossible overlaps
# inside libstdc++'s std::string concatenation (GCC bug 105329), which the main job
# (tools/run.sh) would show a newcomer as if kvlab's code were wrong.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  list(APPEND KVLAB_WARNINGS -Wno-restrict)
endif()

function(kvlab_target_defaults target)
  target_compile_options(${target} PRIVATE ${KVLAB_WARNINGS})
  if(KVLAB_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  if(KVLAB_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined
                           -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
  if(KVLAB_FUZZ AND (target IN_LIST KVLAB_FUZZED_LIBS OR target MATCHES "^fuzz_"))
    # Coverage feedback for libFuzzer in the code the fuzzers drive, without its main():
    # only the fuzz executables link the driver (-fsanitize=fuzzer, fuzz/CMakeLists.txt).
    if(KVLAB_FUZZ_COVERAGE STREQUAL "full")
      target_compile_options(${target} PRIVATE -fsanitize=fuzzer-no-link)
    else()
      target_compile_options(${target} PRIVATE -fsanitize-coverage=inline-8bit-counters,pc-table)
    endif()
  endif()
  # Installed, both roots are <prefix>/include (cmake/KvlabInstall.cmake keeps the layout:
  # include/kvlab/*.h, include/harness/*.h, include/reference/*.h, include/cache/*.h).
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
                             $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:include>)
endfunction()

# Appends the flags held in the cache string `var` to a target's compile options.
function(kvlab_extra_flags target var)
  separate_arguments(flags UNIX_COMMAND "${${var}}")
  target_compile_options(${target} PRIVATE ${flags})
endfunction()

# Marks a target as test code: it gets KVLAB_TEST_CXX_FLAGS (see the top CMakeLists).
function(kvlab_test_code target)
  kvlab_extra_flags(${target} KVLAB_TEST_CXX_FLAGS)
endfunction()

# Marks a target as glue (argument and file handling that calls the libraries): it gets
# KVLAB_GLUE_CXX_FLAGS (see the top CMakeLists).
function(kvlab_glue_code target)
  kvlab_extra_flags(${target} KVLAB_GLUE_CXX_FLAGS)
endfunction()

# kvlab_add_library(name SOURCES ... LIBS ...)
function(kvlab_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  kvlab_target_defaults(${name})
  target_link_libraries(${name} PUBLIC ${ARG_LIBS})
endfunction()

# kvlab_add_executable(name SOURCES ... LIBS ...)
function(kvlab_add_executable name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  kvlab_target_defaults(${name})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS})
endfunction()

# kvlab_add_test(name SOURCES ... LIBS ... LABELS label [ENV ...] [TIMEOUT s] [PREFIX p])
# One gtest executable; each TEST becomes a CTest test carrying the label (one: the
# property list cannot carry a list), named PREFIX + Suite.Test.
function(kvlab_add_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT;PREFIX" "SOURCES;LIBS;LABELS;ENV" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  kvlab_add_executable(${name} SOURCES ${ARG_SOURCES} LIBS ${ARG_LIBS} GTest::gtest_main GTest::gmock)
  kvlab_test_code(${name})
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    TEST_PREFIX "${ARG_PREFIX}"
    PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT} ENVIRONMENT "${ARG_ENV}")
endfunction()
