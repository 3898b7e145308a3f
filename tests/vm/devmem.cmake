# Live-kernel devmem paths (issue 17): real dma-bufs (udmabuf, virtio-gpu, vgem) and e1000e,
# virtio-net and netdevsim NICs on Debian's 6.12 under QEMU, one boot (about 40 s on 2 cores);
# the devmem integration tests run inside and no kernel WARNING may appear. 77: no QEMU.
add_test(NAME vm.devmem COMMAND ${CMAKE_CURRENT_LIST_DIR}/devmem.sh ${CMAKE_BINARY_DIR})
set_tests_properties(vm.devmem PROPERTIES LABELS vm SKIP_RETURN_CODE 77 TIMEOUT 300)
