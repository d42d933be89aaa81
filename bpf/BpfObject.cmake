# SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
# bpf_object(NAME SOURCE [DEFINES D...]): SOURCE (.bpf.c) -> NAME.bpf.o -> NAME.skel.h, and an
# INTERFACE target NAME_skel whose include directory holds the skeleton. DEFINES are passed to
# clang as -DD (a variant of one source). Header dependencies are tracked through clang's
# depfile.
find_program(BPF_CLANG NAMES clang clang-14 REQUIRED)
find_program(BPFTOOL NAMES bpftool PATHS /usr/sbin /usr/local/sbin REQUIRED)
execute_process(COMMAND ${CMAKE_C_COMPILER} -print-multiarch
                OUTPUT_VARIABLE BPF_MULTIARCH OUTPUT_STRIP_TRAILING_WHITESPACE)

function(bpf_object name source)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "DEFINES")
  list(TRANSFORM arg_DEFINES PREPEND -D)
  set(out_dir ${CMAKE_CURRENT_BINARY_DIR})
  set(obj ${out_dir}/${name}.bpf.o)
  set(skel ${out_dir}/${name}.skel.h)
  add_custom_command(
    OUTPUT ${obj}
    COMMAND ${BPF_CLANG} -O2 -g -target bpf -mcpu=v3
            -Wall -Wextra -Werror -Wno-unused-parameter
            -I${CMAKE_SOURCE_DIR}/bpf/include -I/usr/include/${BPF_MULTIARCH}
            ${arg_DEFINES} -MD -MF ${obj}.d
            -c ${CMAKE_CURRENT_SOURCE_DIR}/${source} -o ${obj}
    DEPFILE ${obj}.d
    DEPENDS ${source}
    COMMENT "BPF ${source}"
    VERBATIM)
  add_custom_command(
    OUTPUT ${skel}
    COMMAND ${BPFTOOL} gen skeleton ${obj} name ${name} > ${skel}
    DEPENDS ${obj}
    COMMENT "skeleton ${name}.skel.h"
    VERBATIM)
  add_custom_target(${name}_skel_gen DEPENDS ${skel})
  add_library(${name}_skel INTERFACE)
  add_dependencies(${name}_skel ${name}_skel_gen)
  target_include_directories(${name}_skel INTERFACE ${out_dir} ${CMAKE_SOURCE_DIR}/bpf/include)
  set_property(GLOBAL APPEND PROPERTY MPSTEER_BPF_OBJECTS ${obj})
endfunction()

# bpf_headers_self_contained(HEADER...): each header compiles on its own (with and without
# MPS_NO_KERNEL_BTF), so none relies on what its includer defined before it; part of ALL.
function(bpf_headers_self_contained)
  set(stamps)
  foreach(h ${ARGN})
    get_filename_component(n ${h} NAME_WE)
    foreach(variant btf nobtf)
      set(def)
      if(variant STREQUAL nobtf)
        set(def -DMPS_NO_KERNEL_BTF)
      endif()
      set(stamp ${CMAKE_CURRENT_BINARY_DIR}/self-contained/${n}.${variant}.stamp)
      add_custom_command(
        OUTPUT ${stamp}
        COMMAND ${BPF_CLANG} -O2 -target bpf -mcpu=v3 -Wall -Wextra -Werror
                -Wno-unused-parameter -I${CMAKE_SOURCE_DIR}/bpf/include
                -I/usr/include/${BPF_MULTIARCH} ${def} -fsyntax-only
                -include ${CMAKE_CURRENT_SOURCE_DIR}/${h} -x c /dev/null
        COMMAND ${CMAKE_COMMAND} -E touch ${stamp}
        DEPENDS ${h}
        IMPLICIT_DEPENDS C ${CMAKE_CURRENT_SOURCE_DIR}/${h}
        COMMENT "BPF header ${h} on its own (${variant})"
        VERBATIM)
      list(APPEND stamps ${stamp})
    endforeach()
  endforeach()
  add_custom_target(bpf_headers_self_contained ALL DEPENDS ${stamps})
endfunction()
