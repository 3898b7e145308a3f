# Live-kernel host checks (issue 17): the doctor's verdicts on Debian's 6.12 under QEMU, one
# boot per IOMMU mode on a topology with ACS and non-ACS root ports and a PCIe switch. 77: no QEMU.
add_test(NAME vm.host_checks COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/host_checks.sh ${CMAKE_BINARY_DIR})
set_tests_properties(vm.host_checks PROPERTIES LABELS vm SKIP_RETURN_CODE 77 TIMEOUT 420)
