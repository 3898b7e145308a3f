// Test helper: one client action per run, so tests can act as another process or another uid
// (run it under setpriv). Prints "ok ..." or "error NAME: message" and exits 0 or 1.
//   hold NETDEV GPU BYTES FLOW...   request a binding for a fresh sealed memfd, print
//                                   "ok ID KEYHEX", then wait until stdin closes or a signal
//   hold-active NETDEV GPU BYTES FLOW...  the same, activating the binding with its key; when
//                                   stdin closes, print "data RXBYTES HEX" (the region's first
//                                   min(RXBYTES, BYTES) bytes)
//   renew-flood ID N                 Renew ID with a wrong key N times: "ERRORNAME COUNT"...,
//   "done" renew-own NETDEV GPU BYTES FLOW...  request, activate and renew one binding: "renewed ID
//   US" hold-until-end NETDEV GPU BYTES FLOW...  request and activate, print "ok ID KEYHEX", then
//                                   wait (30 s at most, or KNOD_TEST_WAIT_MS) for the daemon to
//                                   say the binding ended:
//                                   "ended revoked|released REASON"
//   hostile-notifier NETDEV GPU BYTES FLOW...  hold-until-end, also taking the data notifier
//                                   (RxNotifier), making its end blocking, shrinking the pipe to
//                                   one page, trying to write into it and reading nothing; at the
//                                   end: "... notified RECORDS LAST_TOTAL [wrote]"
//   watch                           subscribe (Manager.Subscribe; a refusal is printed and
//                                   ignored) and add a plain match rule for the daemon's
//                                   signals, print "ready", then one line per signal received
//                                   ("signal MEMBER PATH ARGS...") until stdin closes
//   watch-own FLOW1 FLOW2            a holder that never subscribes, with a plain match rule on
//                                   the connection it requests from: request FLOW1, activate
//                                   and release it, request FLOW2, print "ready ID2", then one
//                                   line per signal received (as watch) until stdin closes
//   request-many N NETDEV GPU FLOW [FIRST]  request N bindings (one sealed memfd), printing
//                                   "key KEYID" for each grant as it arrives, then wait until
//                                   stdin closes. With FIRST, binding i gets FLOW with "{a}"
//                                   replaced by 1 + k % 250 and "{p}" by 5000 + k / 250, where
//                                   k = FIRST + i (distinct flows: flows are exclusive)
//   flood CONNS REQUESTS ACTIVATES NETDEV GPU GOOD_FLOW BAD_FLOW  hold one binding for GOOD_FLOW,
//                                   then from CONNS connections at once send REQUESTS requests
//                                   for BAD_FLOW and ACTIVATES wrong-key Activate calls; print
//                                   "CALL ERRORNAME COUNT" per outcome ("ok" for none), "done"
//   activate ID KEYHEX | release ID | list | revoke ID REASON | reload
//   set-job ID KEYHEX JOB GROUP RANK  Binding.SetJob on someone's binding with that key
//   KNOD_TEST_JOB (with KNOD_TEST_JOB_GROUP, KNOD_TEST_JOB_RANK) set: hold and hold-active tag
//                                   their binding with it (SetJob) before printing "ok ..."
//   --udmabuf before hold or hold-active: the region is a udmabuf dma-buf (BYTES page-aligned)
#include "client/client.h"
#include "knod/hex.h"

#include <fcntl.h>
#include <linux/udmabuf.h>
#include <poll.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <systemd/sd-bus.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

namespace {

int report(const knod::Result<void> &r) {
    if (r) {
        std::cout << "ok" << std::endl;
        return 0;
    }
    std::cout << "error " << r.error().message << std::endl;
    return 1;
}

std::vector<std::uint8_t> from_hex(const std::string &hex) {
    std::vector<std::uint8_t> out;
    for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
        out.push_back(static_cast<std::uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    return out;
}

// What an ordinary listener gets: its match rule (no eavesdropping) plus whatever is addressed
// to it. Each signal is printed on one line with its arguments, as sd-bus dumps them.
int print_signals(sd_bus *bus);

int watch() {
    sd_bus *bus = nullptr;
    if (sd_bus_open_system(&bus) < 0) {
        std::cout << "error cannot connect" << std::endl;
        return 1;
    }
    sd_bus_error e = SD_BUS_ERROR_NULL;
    // Proven first, as the client library does (root's right to see every binding needs it).
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == 0) {
        (void)sd_bus_call_method(bus, "org.knod.Policy1", "/org/knod/Policy1",
                                 "org.knod.Policy1.Manager", "AttestProcess", &e, nullptr, "h",
                                 pair[0]);
        sd_bus_error_free(&e);
        close(pair[0]);
        close(pair[1]);
    }
    if (sd_bus_call_method(bus, "org.knod.Policy1", "/org/knod/Policy1", "org.knod.Policy1.Manager",
                           "Subscribe", &e, nullptr, "") < 0)
        std::cout << "subscribe-failed " << (e.name ? e.name : "?") << std::endl;
    sd_bus_error_free(&e);
    if (sd_bus_add_match(bus, nullptr, "type='signal',sender='org.knod.Policy1'", nullptr,
                         nullptr) < 0) {
        std::cout << "error cannot add the match" << std::endl;
        return 1;
    }
    std::cout << "ready" << std::endl;
    return print_signals(bus);
}

// One line per signal on `bus` ("signal MEMBER PATH ARGS...") until stdin closes.
int print_signals(sd_bus *bus) {
    for (;;) {
        sd_bus_message *m = nullptr;
        int r = sd_bus_process(bus, &m);
        if (r < 0) return 1;
        if (m && sd_bus_message_is_signal(m, nullptr, nullptr) > 0) {
            char *text = nullptr;
            size_t size = 0;
            FILE *f = open_memstream(&text, &size);
            if (f) {
                sd_bus_message_dump(m, f, 0);
                fclose(f);
            }
            std::string args(text ? text : "", size);
            free(text);
            for (char &c : args)
                if (c == '\n') c = ' ';
            std::cout << "signal " << sd_bus_message_get_member(m) << " "
                      << sd_bus_message_get_path(m) << " " << args << std::endl;
        }
        sd_bus_message_unref(m);
        if (r > 0) continue;
        struct pollfd fds[2] = {{sd_bus_get_fd(bus), static_cast<short>(sd_bus_get_events(bus)), 0},
                                {STDIN_FILENO, POLLIN, 0}};
        if (poll(fds, 2, -1) < 0) return 1;
        if (fds[1].revents) {
            char c;
            if (read(STDIN_FILENO, &c, 1) <= 0) break;
        }
    }
    sd_bus_flush_close_unref(bus);
    return 0;
}

int sealed_memfd(std::uint64_t bytes) {
    int fd = memfd_create("knod-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)
        return -1;
    return fd;
}

// watch-own: a holder that never subscribed, listening with a plain match rule on the
// connection its bindings came from. Requests FLOW1, activates and releases it, requests FLOW2,
// prints "ready ID2" and then every signal it gets (print_signals).
int watch_own(const std::string &flow1, const std::string &flow2) {
    sd_bus *bus = nullptr;
    if (sd_bus_open_system(&bus) < 0) {
        std::cout << "error cannot connect" << std::endl;
        return 1;
    }
    if (sd_bus_add_match(bus, nullptr, "type='signal',sender='org.knod.Policy1'", nullptr,
                         nullptr) < 0) {
        std::cout << "error cannot add the match" << std::endl;
        return 1;
    }
    auto request = [&](const std::string &flow, std::string *path, std::vector<std::uint8_t> *key) {
        sd_bus_error e = SD_BUS_ERROR_NULL;
        sd_bus_message *reply = nullptr;
        int fd = sealed_memfd(4096);
        int r = sd_bus_call_method(bus, "org.knod.Policy1", "/org/knod/Policy1",
                                   "org.knod.Policy1.Manager", "RequestBinding", &e, &reply,
                                   "ssshttas", "knodsim0", "sim0", "rx-only", fd, std::uint64_t{0},
                                   std::uint64_t{4096}, 1, flow.c_str());
        close(fd);
        const char *o = nullptr, *id = nullptr;
        const void *bytes = nullptr;
        size_t n = 0;
        if (r >= 0) r = sd_bus_message_read(reply, "os", &o, &id);
        if (r >= 0) r = sd_bus_message_read_array(reply, 'y', &bytes, &n);
        if (r >= 0) {
            *path = o;
            key->assign(static_cast<const std::uint8_t *>(bytes),
                        static_cast<const std::uint8_t *>(bytes) + n);
        } else {
            std::cout << "error RequestBinding " << (e.message ? e.message : "?") << std::endl;
        }
        sd_bus_message_unref(reply);
        sd_bus_error_free(&e);
        return r >= 0;
    };
    auto call = [&](const std::string &path, const char *method,
                    const std::vector<std::uint8_t> *key) {
        sd_bus_error e = SD_BUS_ERROR_NULL;
        sd_bus_message *m = nullptr;
        int r = sd_bus_message_new_method_call(bus, &m, "org.knod.Policy1", path.c_str(),
                                               "org.knod.Policy1.Binding", method);
        if (r >= 0 && key) r = sd_bus_message_append_array(m, 'y', key->data(), key->size());
        if (r >= 0) r = sd_bus_call(bus, m, 0, &e, nullptr);
        if (r < 0)
            std::cout << "error " << method << " " << (e.message ? e.message : "?") << std::endl;
        sd_bus_message_unref(m);
        sd_bus_error_free(&e);
        return r >= 0;
    };
    std::string path1, path2;
    std::vector<std::uint8_t> key1, key2;
    if (!request(flow1, &path1, &key1) || !call(path1, "Activate", &key1) ||
        !call(path1, "Release", nullptr) || !request(flow2, &path2, &key2))
        return 1;
    std::cout << "ready " << path2.substr(path2.rfind('/') + 1) << std::endl;
    return print_signals(bus);
}

std::string nth_flow(std::string flow, int k) {
    auto put = [&](const std::string &mark, int value) {
        for (auto at = flow.find(mark); at != std::string::npos; at = flow.find(mark))
            flow.replace(at, mark.size(), std::to_string(value));
    };
    put("{a}", 1 + k % 250);
    put("{p}", 5000 + k / 250);
    return flow;
}

// The D-Bus error name of a client error ("org.knod.Policy1.Error.X: message").
std::string error_name(const knod::Error &e) {
    return e.message.substr(0, e.message.find(':'));
}

int flood(const std::vector<std::string> &args, knod::client::Client &main_client) {
    int conns = std::stoi(args[1]), requests = std::stoi(args[2]), activates = std::stoi(args[3]);
    int fd = sealed_memfd(4096);
    auto held = main_client.request_binding(args[4], args[5], "rx-only", fd, 0, 4096, {args[6]});
    if (!held) {
        std::cout << "error " << held.error().message << std::endl;
        return 1;
    }
    std::mutex mu;
    std::map<std::string, int> outcomes;
    std::vector<std::thread> threads;
    for (int t = 0; t < conns; ++t)
        threads.emplace_back([&, t] {
            auto c = knod::client::Client::connect();
            std::map<std::string, int> mine;
            if (!c) {
                mine["connect " + error_name(c.error())] += 1;
            } else {
                std::vector<std::uint8_t> wrong(held->key.size(), 0x5a);
                int n_req = requests / conns + (t < requests % conns ? 1 : 0);
                int n_act = activates / conns + (t < activates % conns ? 1 : 0);
                for (int i = 0; i < n_req || i < n_act; ++i) {
                    if (i < n_req) {
                        auto g =
                            c->request_binding(args[4], args[5], "rx-only", fd, 0, 4096, {args[7]});
                        mine[std::string("RequestBinding ") + (g ? "ok" : error_name(g.error()))] +=
                            1;
                    }
                    if (i < n_act) {
                        auto a = c->activate(held->id, wrong);
                        mine[std::string("Activate ") + (a ? "ok" : error_name(a.error()))] += 1;
                    }
                }
            }
            std::lock_guard lock(mu);
            for (auto &[k, v] : mine)
                outcomes[k] += v;
        });
    for (auto &t : threads)
        t.join();
    for (auto &[k, v] : outcomes)
        std::cout << k << " " << v << std::endl;
    std::cout << "done" << std::endl;
    close(fd);
    return 0; // the held binding ends with this process
}

} // namespace

int main(int argc, char **argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty()) {
        std::cerr << "usage: see the header of tests/tools/knod_test_client.cc\n";
        return 2;
    }
    if (args[0] == "watch") return watch();
    if (args[0] == "watch-own" && args.size() == 3) return watch_own(args[1], args[2]);
    auto client = knod::client::Client::connect();
    if (!client) {
        std::cout << "error " << client.error().message << std::endl;
        return 1;
    }
    // --udmabuf: hold and hold-active offer a real dma-buf (/dev/udmabuf over a sealed memfd).
    bool udmabuf = args[0] == "--udmabuf";
    if (udmabuf) args.erase(args.begin());
    if (args.empty()) return 2;
    const std::string &cmd = args[0];
    if ((cmd == "hold" || cmd == "hold-active") && args.size() >= 5) {
        std::uint64_t bytes = std::stoull(args[3]);
        int fd = memfd_create("knod-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
            fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
            std::cout << "error memfd" << std::endl;
            return 1;
        }
        if (udmabuf) {
            int dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
            udmabuf_create create{};
            create.memfd = static_cast<std::uint32_t>(fd);
            create.flags = UDMABUF_FLAGS_CLOEXEC;
            create.size = bytes;
            int buf = dev < 0 ? -1 : ioctl(dev, UDMABUF_CREATE, &create);
            if (buf < 0) {
                std::cout << "error udmabuf: " << std::strerror(errno) << std::endl;
                return 1;
            }
            close(dev);
            close(fd);
            fd = buf;
        }
        std::vector<std::string> flows(args.begin() + 4, args.end());
        auto g = client->request_binding(args[1], args[2], "rx-only", fd, 0, bytes, flows);
        if (!g) {
            std::cout << "error " << g.error().message << std::endl;
            return 1;
        }
        if (cmd == "hold-active") {
            if (auto a = client->activate(g->id, g->key); !a) return report(a);
        }
        if (const char *job = std::getenv("KNOD_TEST_JOB")) {
            const char *group = std::getenv("KNOD_TEST_JOB_GROUP");
            const char *rank = std::getenv("KNOD_TEST_JOB_RANK");
            if (auto t = client->set_job(g->id, g->key, job, group ? group : "",
                                         rank ? static_cast<std::uint32_t>(std::stoul(rank)) : 0);
                !t)
                return report(t);
        }
        std::cout << "ok " << g->id << " " << knod::to_hex(g->key) << std::endl;
        char c;
        while (read(STDIN_FILENO, &c, 1) > 0) {
        }
        if (cmd == "hold-active") {
            auto rx = client->counters(g->id);
            std::uint64_t n = rx ? std::min<std::uint64_t>(rx->rx_bytes, bytes) : 0;
            std::vector<std::uint8_t> buf(n);
            if (n && pread(fd, buf.data(), n, 0) != static_cast<ssize_t>(n)) return 1;
            std::cout << "data " << (rx ? rx->rx_bytes : 0) << " " << knod::to_hex(buf)
                      << std::endl;
        }
        return 0;
    }
    if ((cmd == "hold-until-end" || cmd == "hostile-notifier") && args.size() >= 5) {
        std::uint64_t bytes = std::stoull(args[3]);
        int fd = memfd_create("knod-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
            fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)
            return 1;
        std::vector<std::string> flows(args.begin() + 4, args.end());
        auto g = client->request_binding(args[1], args[2], "rx-only", fd, 0, bytes, flows);
        if (!g) return report(g.error());
        if (auto a = client->activate(g->id, g->key); !a) return report(a);
        // hostile-notifier: takes the data notifier and does to it what a hostile holder can:
        // makes its own end blocking, shrinks the pipe to one page, tries to write into it, and
        // reads nothing until the binding ends.
        int notifier = -1;
        bool wrote = false;
        if (cmd == "hostile-notifier") {
            auto n = client->rx_notifier(g->id, g->key);
            if (!n) return report(n.error());
            notifier = n->fd.release();
            int fl = fcntl(notifier, F_GETFL);
            fcntl(notifier, F_SETFL, fl & ~O_NONBLOCK);
            fcntl(notifier, F_SETPIPE_SZ, 4096);
            std::uint64_t big = ~std::uint64_t{1};
            wrote = write(notifier, &big, sizeof big) > 0;
        }
        std::cout << "ok " << g->id << " " << knod::to_hex(g->key) << std::endl;
        // KNOD_TEST_WAIT_MS: longer, for a holder that waits out a daemon's stop and start.
        int wait_ms = 30000;
        if (const char *w = std::getenv("KNOD_TEST_WAIT_MS"); w && std::atoi(w) > 0)
            wait_ms = std::atoi(w);
        auto end = client->wait_for_end(g->id, wait_ms);
        if (!end) return report(end.error());
        std::cout << "ended " << (end->revoked ? "revoked " : "released ") << end->reason;
        if (notifier >= 0) {
            fcntl(notifier, F_SETFL, O_NONBLOCK);
            std::uint64_t total = 0, last = 0, records = 0;
            while (read(notifier, &total, sizeof total) == sizeof total) {
                last = total;
                ++records;
            }
            std::cout << " notified " << records << " " << last << (wrote ? " wrote" : "");
        }
        std::cout << std::endl;
        return 0;
    }
    if (cmd == "renew-flood" && args.size() == 3) {
        // Renew ID with a wrong key N times; print "ERRORNAME COUNT" per outcome, then "done".
        std::map<std::string, int> outcomes;
        std::vector<std::uint8_t> wrong(32, 0x5a);
        for (int i = 0; i < std::stoi(args[2]); ++i) {
            auto r = client->renew(args[1], wrong);
            outcomes[r ? "ok" : error_name(r.error())] += 1;
        }
        for (auto &[k, v] : outcomes)
            std::cout << k << " " << v << std::endl;
        std::cout << "done" << std::endl;
        return 0;
    }
    if (cmd == "renew-own" && args.size() >= 5) {
        std::uint64_t bytes = std::stoull(args[3]);
        int fd = sealed_memfd(bytes);
        if (fd < 0) return 1;
        std::vector<std::string> flows(args.begin() + 4, args.end());
        auto g = client->request_binding(args[1], args[2], "rx-only", fd, 0, bytes, flows);
        if (!g) return report(g.error());
        if (auto a = client->activate(g->id, g->key); !a) return report(a);
        auto until = client->renew(g->id, g->key);
        if (!until) return report(until.error());
        std::cout << "renewed " << g->id << " " << *until << std::endl;
        return 0;
    }
    if (cmd == "request-many" && (args.size() == 5 || args.size() == 6)) {
        int n = std::stoi(args[1]);
        int first = args.size() == 6 ? std::stoi(args[5]) : -1;
        int fd = sealed_memfd(4096);
        if (fd < 0) return 1;
        for (int i = 0; i < n; ++i) {
            std::string flow = first < 0 ? args[4] : nth_flow(args[4], first + i);
            auto g = client->request_binding(args[2], args[3], "rx-only", fd, 0, 4096, {flow});
            if (!g) {
                std::cout << "error " << g.error().message << std::endl;
                if (g.error().code == knod::Errc::io || g.error().code == knod::Errc::unavailable)
                    return 1;
                continue;
            }
            std::cout << "key " << g->key_id << std::endl;
        }
        std::cout << "done" << std::endl;
        char c;
        while (read(STDIN_FILENO, &c, 1) > 0) {
        }
        return 0;
    }
    if (cmd == "flood" && args.size() == 8) return flood(args, *client);
    if (cmd == "activate" && args.size() == 3)
        return report(client->activate(args[1], from_hex(args[2])));
    if (cmd == "set-job" && args.size() == 6)
        return report(client->set_job(args[1], from_hex(args[2]), args[3], args[4],
                                      static_cast<std::uint32_t>(std::stoul(args[5]))));
    if (cmd == "release" && args.size() == 2) return report(client->release(args[1]));
    if (cmd == "revoke" && args.size() == 3) return report(client->revoke(args[1], args[2]));
    if (cmd == "reload" && args.size() == 1) {
        auto r = client->reload();
        if (!r) return report(r.error());
        std::cout << "ok " << r->first << " " << r->second << std::endl;
        return 0;
    }
    if (cmd == "list" && args.size() == 1) {
        auto l = client->list();
        if (!l) return report(l.error());
        std::cout << "ok";
        for (auto &b : *l)
            std::cout << " " << b.id;
        std::cout << std::endl;
        return 0;
    }
    std::cerr << "bad arguments\n";
    return 2;
}
