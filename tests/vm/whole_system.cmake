# The Debian package under systemd in a QEMU-booted Debian 12 (tests/vm/whole_system.sh): label
# vm; skipped (77) without QEMU or mmdebstrap. Needs the .deb from the packaging.build_deb
# fixture. 120-200 s on 2 cores with warm caches (kernel, rootfs) before phase E (#52: an upgrade,
# a remove, a purge) added 160-200 s (400-540 s in all on 2026-12-07); it prints its timings.
add_test(NAME vm.whole_system
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/whole_system.sh ${PROJECT_SOURCE_DIR}
                 ${CMAKE_BINARY_DIR}/deb $<TARGET_FILE:knod_test_client>)
set_tests_properties(vm.whole_system PROPERTIES LABELS vm TIMEOUT 1200 SKIP_RETURN_CODE 77
                                                FIXTURES_REQUIRED knod_deb)
