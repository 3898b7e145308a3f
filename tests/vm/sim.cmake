# The sim driver's kernel matrix (issue 50): Debian 12's own 6.1 and Debian's newest 6.12, one
# boot each; DatapathTest inside once per guard path (tc, xdp); no kernel WARNING. 77: no QEMU.
add_test(NAME vm.sim COMMAND ${CMAKE_CURRENT_LIST_DIR}/sim.sh ${CMAKE_BINARY_DIR})
set_tests_properties(vm.sim PROPERTIES LABELS vm SKIP_RETURN_CODE 77 TIMEOUT 600)
