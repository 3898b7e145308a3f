/* A C program of one's own against the installed libknod-client (tests/packaging/sdk_session.sh
 * builds it with `pkg-config --cflags --libs knod-client`): registers a sealed memfd for FLOW on
 * NETDEV, prints "bound ID RULE", waits for EXPECT bytes and prints them. With "--deny" it
 * expects a refusal and prints "denied CODE DBUS_NAME RULE".
 * Usage: receive NETDEV FLOW EXPECT | receive --deny NETDEV FLOW */
#define _GNU_SOURCE
#include <knod/client.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int deny = argc > 1 && strcmp(argv[1], "--deny") == 0;
    if (argc != 4) {
        fprintf(stderr, "usage: receive NETDEV FLOW EXPECT | receive --deny NETDEV FLOW\n");
        return 2;
    }
    const char *netdev = argv[1 + deny], *flow = argv[2 + deny];
    size_t size = 4096;
    int fd = memfd_create("sdk-c", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)
        return 1;
    knod_client *client = NULL;
    knod_binding *b = NULL;
    knod_error *e = NULL;
    if (knod_client_connect(NULL, &client, &e) != KNOD_OK) {
        fprintf(stderr, "connect: %s\n", knod_error_message(e));
        return 1;
    }
    knod_errc rc = knod_register_buffer(client, netdev, "sim0", fd, 0, size, &flow, 1, &b, &e);
    if (deny) {
        if (rc == KNOD_OK) return 1;
        const char *rule = knod_error_rule(e), *name = knod_error_dbus_name(e);
        printf("denied %s %s %s\n", knod_errc_name(rc), name ? name : "-", rule ? rule : "-");
        knod_error_free(e);
        knod_client_unref(client);
        return 0;
    }
    if (rc != KNOD_OK) {
        fprintf(stderr, "register_buffer: %s\n", knod_error_message(e));
        return 1;
    }
    printf("bound %s %s\n", knod_binding_id(b), knod_binding_rule(b));
    fflush(stdout);
    uint64_t expect = strtoull(argv[3], NULL, 10), rx = 0;
    while (rx < expect) {
        rc = knod_binding_wait_for_data(b, rx, 10000, &rx, &e);
        if (rc != KNOD_OK) {
            fprintf(stderr, "wait_for_data: %s (%s)\n", knod_error_message(e), knod_errc_name(rc));
            return 1;
        }
    }
    char *data = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (data == MAP_FAILED) return 1;
    printf("received %llu %.*s\n", (unsigned long long)rx, (int)rx, data);
    if (knod_binding_release(b, &e) != KNOD_OK) {
        fprintf(stderr, "release: %s\n", knod_error_message(e));
        return 1;
    }
    const char *reason = NULL;
    int ended = 0;
    knod_binding_end(b, &ended, &reason, NULL, NULL);
    printf("ended %d %s\n", ended, reason ? reason : "-");
    knod_binding_free(b);
    knod_client_unref(client);
    return 0;
}
