# knod_bpf_skeleton(TARGET SOURCE [HEADERS...]): compiles SOURCE with clang -target bpf and
# generates its libbpf skeleton with bpftool. TARGET is an INTERFACE library whose include
# directory holds <stem>.skel.h; nothing generated is committed.
find_program(KNOD_CLANG clang REQUIRED)
find_program(KNOD_BPFTOOL bpftool PATHS /usr/sbin /sbin REQUIRED)
execute_process(COMMAND ${CMAKE_C_COMPILER} -print-multiarch OUTPUT_VARIABLE KNOD_MULTIARCH
                OUTPUT_STRIP_TRAILING_WHITESPACE)

function(knod_bpf_skeleton target source)
  get_filename_component(stem ${source} NAME_WE) # flow_filter.bpf.c -> flow_filter
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/${target})
  set(object ${dir}/${stem}.bpf.o)
  set(skeleton ${dir}/${stem}.skel.h)
  add_custom_command(
    OUTPUT ${object}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${dir}
    COMMAND ${KNOD_CLANG} -O2 -g -target bpf -Wall -Werror -I/usr/include/${KNOD_MULTIARCH}
            -I${CMAKE_CURRENT_SOURCE_DIR} -c ${CMAKE_CURRENT_SOURCE_DIR}/${source} -o ${object}
    DEPENDS ${source} ${ARGN}
    COMMENT "BPF ${source}")
  add_custom_command(
    OUTPUT ${skeleton}
    COMMAND ${KNOD_BPFTOOL} gen skeleton ${object} name ${stem}_bpf > ${skeleton}
    DEPENDS ${object}
    COMMENT "BPF skeleton ${stem}.skel.h")
  add_custom_target(${target}_gen DEPENDS ${skeleton})
  add_library(${target} INTERFACE)
  add_dependencies(${target} ${target}_gen)
  target_include_directories(${target} INTERFACE ${dir})
  set_property(TARGET ${target} PROPERTY KNOD_BPF_OBJECT ${object})
endfunction()
