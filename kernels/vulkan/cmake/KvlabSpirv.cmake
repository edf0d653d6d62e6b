# kvlab_add_spirv(<target> SOURCES a.comp ... [INCLUDE_DIR dir] [VARIANTS name "defines" ...])
#
# The one helper for shader artifacts: each GLSL compute shader is compiled by glslc at
# build time (--target-env=vulkan1.2 -O -mfmt=c, with a depfile so edits to #included
# .glsl files rebuild it) into <build>/spirv/<target>/<stem>_<variant>.spv.inc, a
# brace-enclosed list of uint32 words that C++ embeds with
#   static const std::uint32_t kWords[] =
#   #include "rope_small.spv.inc"
#   ;
# VARIANTS lists (name, defines) pairs; every source is built once per variant with that
# space-separated list of -D flags (without VARIANTS: one build named `default`).
# <target> is an INTERFACE library: linking it puts the .inc files on the include path
# and builds them before any TU of the consumer.
function(kvlab_add_spirv target)
  cmake_parse_arguments(ARG "" "INCLUDE_DIR" "SOURCES;VARIANTS" ${ARGN})
  set(out_dir ${CMAKE_CURRENT_BINARY_DIR}/spirv/${target})
  file(MAKE_DIRECTORY ${out_dir})
  set(variants ${ARG_VARIANTS})
  if(NOT variants)
    set(variants default "")
  endif()
  set(include_flags)
  if(ARG_INCLUDE_DIR)
    set(include_flags -I ${ARG_INCLUDE_DIR})
  endif()
  set(outputs)
  foreach(src IN LISTS ARG_SOURCES)
    get_filename_component(stem ${src} NAME_WE)
    set(rest ${variants})
    while(rest)
      list(POP_FRONT rest variant defines)
      separate_arguments(define_flags UNIX_COMMAND "${defines}")
      set(out ${out_dir}/${stem}_${variant}.spv.inc)
      add_custom_command(OUTPUT ${out}
        COMMAND ${GLSLC} --target-env=vulkan1.2 -O -mfmt=c ${define_flags} ${include_flags}
                -MD -MF ${out}.d -MT ${out} -o ${out} ${src}
        DEPENDS ${src}
        DEPFILE ${out}.d
        COMMENT "glslc ${stem}.comp (${variant})"
        VERBATIM)
      list(APPEND outputs ${out})
    endwhile()
  endforeach()
  add_custom_target(${target}_build DEPENDS ${outputs})
  add_library(${target} INTERFACE)
  target_include_directories(${target} INTERFACE ${out_dir})
  add_dependencies(${target} ${target}_build)
endfunction()
