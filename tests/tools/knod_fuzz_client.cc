// Test helper: a hostile client. For a bounded number of calls it sends random argument values
// to every method and property of org.knod.Policy1: wrong types, huge arrays, bad fds, absurd
// offsets and lengths, garbage flow specs, unknown objects, and in every string argument control
// characters, oversized strings (up to 320 KiB) and bytes that are not UTF-8 (sd-bus refuses to
// send those, so they are counted as "not sent"; the bus would drop the sender anyway). Calls
// are spread over CONNECTIONS connections (default 1). It counts the replies by kind and exits 0
// when every reply was a method return or a named error.
// Usage: knod_fuzz_client CALLS SEED [CONNECTIONS]
//        knod_fuzz_client big-flow MIB   one RequestBinding whose single flow is MIB MiB long;
//                                        prints "NAME LENGTH" of the error reply
#include <fcntl.h>
#include <sys/mman.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

std::mt19937_64 rng;

std::string junk(std::size_t max) {
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789 ./:*->[]-_%\\\"'\n\t";
    std::string s(rng() % (max + 1), ' ');
    for (auto &c : s)
        c = alphabet[rng() % (sizeof alphabet - 1)];
    return s;
}

// A string argument as an attacker picks it: plausible junk, control characters (no NUL: the
// wire format cannot carry one in a string), a few valid non-ASCII characters, now and then a
// huge one or one that is not UTF-8.
std::string hostile(std::size_t max) {
    static const char *odd[] = {"\x1b]0;pwned\x07",
                                "\x1b[2J",
                                "\r\n=cmd|' /C calc'!A0",
                                "\x7f",
                                "\xc2\x9b",
                                "\xc3\xa9t\xc3\xa9",
                                "\u2028",
                                "\x01\x02\x03"};
    switch (rng() % 16) {
    case 0:
        return std::string(65536 + rng() % (256 << 10), 'A' + static_cast<char>(rng() % 26));
    case 1:
        return junk(max) + "\xff\xfe" + junk(8); // not UTF-8: sd-bus refuses it
    case 2:
    case 3:
        return junk(max / 2) + odd[rng() % (sizeof odd / sizeof *odd)] + junk(max / 2);
    default:
        return junk(max);
    }
}

std::string flow() {
    static const char *shapes[] = {"udp 10.99.0.1:* -> 10.99.0.2:5000",
                                   "udp * -> *",
                                   "tcp [fd00::/8]:* -> *:1",
                                   "udp 10.99.0.0/24:* -> 10.99.0.2:5000-5999",
                                   "",
                                   "garbage",
                                   "udp 300.1.1.1 -> *",
                                   "udp 10.0.0.0/33:* -> *",
                                   "any * -> *:70000"};
    return rng() % 4 == 0 ? hostile(64) : shapes[rng() % (sizeof shapes / sizeof *shapes)];
}

int any_fd() {
    switch (rng() % 6) {
    case 0: {
        int p[2];
        if (pipe(p) != 0) return 0;
        close(p[1]);
        return p[0];
    }
    case 1:
        return open("/dev/null", O_RDONLY | O_CLOEXEC);
    case 2:
        return open("/", O_PATH | O_CLOEXEC);
    case 3: {
        int fd = memfd_create("f", MFD_CLOEXEC); // unsealed
        if (ftruncate(fd, 4096) != 0) return fd;
        return fd;
    }
    default: {
        int fd = memfd_create("f", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (ftruncate(fd, static_cast<off_t>(rng() % 65536)) != 0) return fd;
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK);
        return fd;
    }
    }
}

std::uint64_t absurd() {
    static const std::uint64_t values[] = {
        0, 1, 4096, 65535, 1ull << 32, UINT64_MAX, UINT64_MAX - 4095};
    return rng() % 2 ? values[rng() % 7] : rng();
}

// One RequestBinding with a flow string of `mib` MiB; prints the error's name and length.
int big_flow(long mib) {
    sd_bus *bus = nullptr;
    if (sd_bus_open_system(&bus) < 0) return 1;
    std::string huge(static_cast<std::size_t>(mib) << 20, 'x');
    huge.replace(0, 4, "udp ");
    int fd = memfd_create("f", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, 4096) != 0) return 1;
    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK);
    sd_bus_message *m = nullptr, *reply = nullptr;
    sd_bus_error e = SD_BUS_ERROR_NULL;
    sd_bus_message_new_method_call(bus, &m, "org.knod.Policy1", "/org/knod/Policy1",
                                   "org.knod.Policy1.Manager", "RequestBinding");
    const char *flows[] = {huge.c_str(), nullptr};
    sd_bus_message_append(m, "ssshtt", "knodsim0", "sim0", "rx-only", fd, std::uint64_t{0},
                          std::uint64_t{4096});
    sd_bus_message_append_strv(m, const_cast<char **>(flows));
    int r = sd_bus_call(bus, m, 25'000'000, &e, &reply);
    if (r >= 0)
        std::printf("return 0\n");
    else if (sd_bus_error_is_set(&e))
        std::printf("%s %zu\n", e.name, e.message ? std::strlen(e.message) : 0);
    else
        std::printf("no-reply %d\n", r);
    sd_bus_message_unref(m);
    sd_bus_message_unref(reply);
    sd_bus_error_free(&e);
    sd_bus_flush_close_unref(bus);
    return r < 0 && sd_bus_error_is_set(&e) ? 0 : 1;
}

} // namespace

int main(int argc, char **argv) {
    if (argc == 3 && std::strcmp(argv[1], "big-flow") == 0) return big_flow(std::atol(argv[2]));
    if (argc != 3 && argc != 4) return 2;
    long calls = std::atol(argv[1]);
    rng.seed(std::strtoull(argv[2], nullptr, 10));
    long connections = argc == 4 ? std::max(1L, std::atol(argv[3])) : 1;
    std::vector<sd_bus *> buses;
    for (long i = 0; i < connections; ++i) {
        sd_bus *b = nullptr;
        if (sd_bus_open_system(&b) < 0) return 1;
        buses.push_back(b);
    }
    const char *dest = "org.knod.Policy1", *mgr = "/org/knod/Policy1",
               *iface = "org.knod.Policy1.Manager";
    std::map<std::string, int> tally;
    std::vector<std::string> paths = {
        "/org/knod/Policy1/bindings/bnope", "/org/knod/Policy1/bindings/",
        "/org/knod/Policy1/bindings/b0000000000000000", "/org/knod/Policy1"};
    for (long i = 0; i < calls; ++i) {
        sd_bus *bus = buses[static_cast<std::size_t>(i % connections)];
        sd_bus_message *m = nullptr, *reply = nullptr;
        sd_bus_error e = SD_BUS_ERROR_NULL;
        int r = 0;
        bool unsendable = false; // sd-bus refused an argument (not UTF-8): nothing was sent
        auto append = [&](int rc) {
            if (rc < 0) unsendable = true;
        };
        switch (rng() % 10) {
        case 0:
        case 1: { // RequestBinding with hostile values
            int fd = any_fd();
            sd_bus_message_new_method_call(bus, &m, dest, mgr, iface, "RequestBinding");
            append(sd_bus_message_append(m, "ssshtt", rng() % 3 ? "knodsim0" : hostile(300).c_str(),
                                         rng() % 3 ? "sim0" : hostile(40).c_str(),
                                         rng() % 3 ? "rx-only" : hostile(10).c_str(), fd, absurd(),
                                         absurd()));
            std::vector<std::string> fl(rng() % 4 == 0 ? 5000 : rng() % 4);
            for (auto &f : fl) // thousands of huge flows would pass the bus's own message limit
                f = fl.size() > 16 ? junk(64) : flow();
            std::vector<const char *> strv;
            for (auto &f : fl)
                strv.push_back(f.c_str());
            strv.push_back(nullptr);
            append(sd_bus_message_append_strv(m, const_cast<char **>(strv.data())));
            if (!unsendable) r = sd_bus_call(bus, m, 5'000'000, &e, &reply);
            close(fd);
            // A grant is released again at once, so nothing stays behind.
            const char *path = nullptr;
            if (!unsendable && r >= 0 && sd_bus_message_read(reply, "o", &path) > 0) {
                sd_bus_error e2 = SD_BUS_ERROR_NULL;
                sd_bus_call_method(bus, dest, path, "org.knod.Policy1.Binding", "Release", &e2,
                                   nullptr, "");
                sd_bus_error_free(&e2);
                paths.push_back(path);
            }
            break;
        }
        case 2: { // wrong signature
            sd_bus_message_new_method_call(bus, &m, dest, mgr, iface, "RequestBinding");
            sd_bus_message_append(m, "us", static_cast<std::uint32_t>(rng()), junk(20).c_str());
            r = sd_bus_call(bus, m, 5'000'000, &e, &reply);
            break;
        }
        case 3: { // Activate with random bytes on some object
            std::string key = junk(rng() % 2 ? 32 : 5000);
            sd_bus_message_new_method_call(bus, &m, dest, paths[rng() % paths.size()].c_str(),
                                           "org.knod.Policy1.Binding", "Activate");
            sd_bus_message_append_array(m, 'y', key.data(), key.size());
            r = sd_bus_call(bus, m, 5'000'000, &e, &reply);
            break;
        }
        case 4:
            r = sd_bus_call_method(bus, dest, paths[rng() % paths.size()].c_str(),
                                   "org.knod.Policy1.Binding", "Release", &e, &reply, "");
            break;
        case 5:
            r = sd_bus_call_method(bus, dest, mgr, iface, "RevokeBinding", &e, &reply, "ss",
                                   hostile(30).c_str(), hostile(30).c_str());
            unsendable = r == -EINVAL && !sd_bus_error_is_set(&e);
            break;
        case 6: {
            static const char *props[] = {"Netdev", "RxBytes", "Flows", "Queues", "Nope", "KeyId"};
            r = sd_bus_call_method(bus, dest, paths[rng() % paths.size()].c_str(),
                                   "org.freedesktop.DBus.Properties", "Get", &e, &reply, "ss",
                                   "org.knod.Policy1.Binding",
                                   rng() % 4 ? props[rng() % 6] : hostile(20).c_str());
            unsendable = r == -EINVAL && !sd_bus_error_is_set(&e);
            break;
        }
        case 7: { // the other readers: GetAll, Introspect, GetHostReport, manager properties
            static const char *what[] = {"GetAll", "Introspect", "GetHostReport", "Get"};
            const char *w = what[rng() % 4];
            const std::string &p = paths[rng() % paths.size()];
            if (!std::strcmp(w, "GetAll"))
                r = sd_bus_call_method(
                    bus, dest, p.c_str(), "org.freedesktop.DBus.Properties", "GetAll", &e, &reply,
                    "s", rng() % 2 ? "org.knod.Policy1.Binding" : hostile(20).c_str());
            else if (!std::strcmp(w, "Introspect"))
                r = sd_bus_call_method(bus, dest, p.c_str(), "org.freedesktop.DBus.Introspectable",
                                       "Introspect", &e, &reply, "");
            else if (!std::strcmp(w, "GetHostReport"))
                r = sd_bus_call_method(bus, dest, mgr, iface, "GetHostReport", &e, &reply, "");
            else
                r = sd_bus_call_method(bus, dest, mgr, "org.freedesktop.DBus.Properties", "Get", &e,
                                       &reply, "ss", iface,
                                       rng() % 2 ? "BindingCount" : hostile(12).c_str());
            unsendable = r == -EINVAL && !sd_bus_error_is_set(&e);
            break;
        }
        case 8: // a method that does not exist, and a property write
            r = rng() % 2
                    ? sd_bus_call_method(bus, dest, mgr, iface, "Nope", &e, &reply, "")
                    : sd_bus_call_method(bus, dest, mgr, "org.freedesktop.DBus.Properties", "Set",
                                         &e, &reply, "ssv", iface, "Permissive", "b", 1);
            break;
        default:
            r = sd_bus_call_method(bus, dest, mgr, iface,
                                   rng() % 2 ? "ReloadPolicy" : "ListBindings", &e, &reply, "");
        }
        if (unsendable)
            ++tally["not sent (sd-bus refused an argument)"];
        else if (r >= 0)
            ++tally["return"];
        else if (sd_bus_error_is_set(&e))
            ++tally[e.name];
        else
            ++tally["no reply: " + std::to_string(r)];
        sd_bus_message_unref(m);
        sd_bus_message_unref(reply);
        sd_bus_error_free(&e);
    }
    bool ok = true;
    for (auto &[k, n] : tally) {
        std::printf("%s %d\n", k.c_str(), n);
        if (k.rfind("no reply", 0) == 0) ok = false;
    }
    for (auto *b : buses)
        sd_bus_flush_close_unref(b);
    return ok ? 0 : 1;
}
