// Journal at audit scale: fills a journal with N sessions and their events (grant + end), then
// measures what an auditor does: a query by uid and time range (p50/p99) over sessions and over
// events, `verify` over every event, and the export rate through the real export path
// (journal::export_jsonl, as `audit export` writes it, into /dev/null). Prints the figures;
// targets are in docs/audit.md.
//   knod_journal_bench [--sessions N] [--db PATH] [--keep]
#include "cli/audit_format.h"
#include "journal/export.h"
#include "journal/journal.h"
#include "journal/reader.h"
#include "journal/verify.h"
#include "knod/sha256.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

using namespace knod;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Direct SQL in large transactions, computing the same chain the daemon writes.
bool generate(const std::string &path, std::int64_t sessions) {
    auto db = journal::open_and_migrate(path);
    if (!db) {
        std::fprintf(stderr, "%s\n", db.error().message.c_str());
        return false;
    }
    (void)db->exec("PRAGMA synchronous=OFF");
    auto ses = db->prepare(
        "INSERT INTO sessions (id, uid, pid, exe, unit, netdev, gpu, mode, region_bytes, "
        "flows, key_id, rule, started_us, ended_us, end_reason, rx_bytes, rx_packets) "
        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
    auto ev =
        db->prepare("INSERT INTO events (seq, at_us, kind, session_id, uid, pid, rule, decision, "
                    "reason, detail, prev_hash, hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)");
    if (!ses || !ev) return false;
    journal::Hash prev{};
    std::int64_t seq = 0;
    const std::int64_t t0 = 1'700'000'000'000'000; // Nov 2023, one session every 10 s
    auto append = [&](journal::Event e) {
        ++seq;
        journal::Hash h = journal::chain_hash(prev, seq, e);
        ev->bind(1, seq).bind(2, e.at_us).bind(3, e.kind).bind(4, e.session_id).bind(5, e.uid);
        ev->bind(6, e.pid).bind(7, e.rule).bind(8, e.decision).bind(9, e.reason).bind(10, e.detail);
        ev->bind_blob(11, prev.data(), prev.size()).bind_blob(12, h.data(), h.size());
        (void)ev->run();
        prev = h;
    };
    (void)db->exec("BEGIN");
    // The daemon's start: the policy it loaded, stored once under its digest.
    const std::string policy_text =
        "# file: /etc/knod/policy.toml\n[[rule]]\nname = \"ml-inference\"\n";
    const std::string digest = sha256_hex(policy_text);
    auto pol = db->prepare("INSERT INTO policies (digest, text, first_loaded_us) VALUES (?,?,?)");
    if (!pol) return false;
    pol->bind(1, digest).bind(2, policy_text).bind(3, t0 - 1);
    (void)pol->run();
    journal::Event load;
    load.at_us = t0 - 1;
    load.kind = journal::kind::daemon_start;
    load.uid = 0;
    load.pid = 1;
    load.detail = nlohmann::json{{"driver", "knod"}, {"policy", digest}}.dump();
    append(load);
    for (std::int64_t i = 0; i < sessions; ++i) {
        std::string id = "b" + std::to_string(i);
        std::int64_t uid = 1000 + i % 500, start = t0 + i * 10'000'000, end = start + 5'000'000;
        std::string netdev = "eth" + std::to_string(i % 8);
        ses->bind(1, id)
            .bind(2, uid)
            .bind(3, std::int64_t{4000 + i % 30000})
            .bind(4, std::string("/usr/bin/python3"));
        std::string unit = "inference@" + std::to_string(i % 64) + ".service";
        ses->bind(5, unit).bind(6, netdev);
        ses->bind(7, std::string("0000:c1:00.0"))
            .bind(8, std::string("rx-only"))
            .bind(9, std::int64_t{1 << 26});
        ses->bind(10, std::string(R"(["udp 10.20.0.0/16:* -> 10.20.1.10:5000-5100"])"));
        ses->bind(11, "k-" + id)
            .bind(12, std::string("ml-inference"))
            .bind(13, start)
            .bind(14, end);
        ses->bind(15, std::string("release"))
            .bind(16, std::int64_t{1 << 24})
            .bind(17, std::int64_t{4096});
        (void)ses->run();
        // The events as the daemon writes them: the grant carries every value of the row
        // ("session"), the end the values the row gets ("end"), so verify checks every row.
        nlohmann::json values{{"id", id},
                              {"uid", uid},
                              {"pid", std::int64_t{4000 + i % 30000}},
                              {"exe", "/usr/bin/python3"},
                              {"unit", unit},
                              {"netdev", netdev},
                              {"gpu", "0000:c1:00.0"},
                              {"mode", "rx-only"},
                              {"region_bytes", std::int64_t{1 << 26}},
                              {"flows", {"udp 10.20.0.0/16:* -> 10.20.1.10:5000-5100"}},
                              {"key_id", "k-" + id},
                              {"rule", "ml-inference"},
                              {"started_us", start}};
        journal::Event g;
        g.at_us = start;
        g.kind = journal::kind::granted;
        g.session_id = id;
        g.uid = uid;
        g.rule = "ml-inference";
        g.decision = "allow";
        g.reason = "allowed by rule 'ml-inference'";
        g.detail = nlohmann::json{
            {"netdev", netdev},
            {"gpu", "0000:c1:00.0"},
            {"policy", digest},
            {"session",
             values}}.dump();
        append(g);
        journal::Event e;
        e.at_us = end;
        e.kind = journal::kind::ended;
        e.session_id = id;
        e.uid = uid;
        e.reason = "release";
        e.detail = nlohmann::json{{"rx_bytes", 16777216},
                                  {"rx_packets", 4096},
                                  {"dropped_packets", 0},
                                  {"end",
                                   {{"ended_us", end},
                                    {"end_reason", "release"},
                                    {"rx_bytes", 16777216},
                                    {"rx_packets", 4096},
                                    {"dropped_packets", 0}}}}
                       .dump();
        append(e);
        if (i % 100000 == 99999) {
            (void)db->exec("COMMIT; BEGIN");
            std::fprintf(stderr, "\rgenerated %lld sessions", static_cast<long long>(i + 1));
        }
    }
    (void)db->exec("COMMIT");
    std::fprintf(stderr, "\n");
    // The anchor beside it, as the daemon leaves it: verify requires one.
    std::ofstream(journal::anchor_path(path))
        << nlohmann::json{{"seq", seq}, {"hash", journal::to_hex(prev)}}.dump() << "\n";
    return db->exec("PRAGMA wal_checkpoint(TRUNCATE)").ok();
}

} // namespace

int main(int argc, char **argv) {
    std::int64_t sessions = 1'000'000;
    std::string path = "/tmp/knod-journal-bench.db";
    bool keep = false;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--sessions") && i + 1 < argc)
            sessions = std::atoll(argv[++i]);
        else if (!std::strcmp(argv[i], "--db") && i + 1 < argc)
            path = argv[++i];
        else if (!std::strcmp(argv[i], "--keep"))
            keep = true;
        else {
            std::fprintf(stderr, "usage: %s [--sessions N] [--db PATH] [--keep]\n", argv[0]);
            return 2;
        }
    }
    for (auto suffix : {"", "-wal", "-shm", ".anchor"})
        std::filesystem::remove(path + suffix);
    auto t = Clock::now();
    if (!generate(path, sessions)) return 1;
    std::printf("generated %lld sessions, %lld events in %.1f s (%.0f MiB)\n",
                static_cast<long long>(sessions), static_cast<long long>(2 * sessions),
                ms_since(t) / 1000,
                static_cast<double>(std::filesystem::file_size(path)) / (1 << 20));

    auto reader = journal::JournalReader::open(path);
    if (!reader) return 1;
    std::mt19937_64 rng(42);
    const std::int64_t t0 = 1'700'000'000'000'000;
    // 101 queries of one user over one day at a random point of the journal, as `audit sessions
    // --uid U --since ... --until ...` (or `audit events ...`) asks; the sorted times and rows.
    struct Timings {
        std::vector<double> ms;
        std::size_t rows = 0;
    };
    auto time_queries = [&](auto &&query) {
        Timings out;
        for (int q = 0; q < 101; ++q) {
            journal::Filter f;
            f.uid = 1000 + static_cast<std::int64_t>(rng() % 500);
            f.since_us =
                t0 + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(sessions)) *
                         10'000'000;
            f.until_us = *f.since_us + 24ll * 3600 * 1000000; // one day
            auto start = Clock::now();
            query(f, out.rows);
            out.ms.push_back(ms_since(start));
        }
        std::sort(out.ms.begin(), out.ms.end());
        return out;
    };
    auto by_session = time_queries([&](const journal::Filter &f, std::size_t &rows) {
        (void)reader->sessions(f, [&](const journal::Session &) { return ++rows, true; });
    });
    std::printf("query by uid + one-day range: p50 %.2f ms, p99 %.2f ms (target p50 < 50 ms); %zu "
                "rows over 101 queries\n",
                by_session.ms[50], by_session.ms[99], by_session.rows);
    // The same over events (`audit events --uid U --since ... --until ...`): by time, then uid.
    auto by_event = time_queries([&](const journal::Filter &f, std::size_t &rows) {
        (void)reader->events(f, [&](const journal::EventRecord &) { return ++rows, true; });
    });
    std::printf("events by uid + one-day range: p50 %.2f ms, p99 %.2f ms (target p50 < 50 ms, "
                "ratio %.2f); %zu rows over 101 queries\n",
                by_event.ms[50], by_event.ms[99], by_event.ms[50] / 50, by_event.rows);

    t = Clock::now();
    auto v = journal::verify_chain(path); // with the anchor written beside it, as audit does
    double verify_ms = ms_since(t);
    if (!v || !v->ok) {
        std::fprintf(stderr, "verify: %s\n", v ? v->problem.c_str() : v.error().message.c_str());
        return 1;
    }
    std::printf("verify (chain, anchor, and %lld session rows, %lld policy texts against it): "
                "%lld events in %.2f s, %.2f s per 1M events (target < 5 s per 1M)\n",
                static_cast<long long>(v->sessions_checked),
                static_cast<long long>(v->policies_checked),
                static_cast<long long>(v->events_checked), verify_ms / 1000,
                verify_ms / 1000 / (static_cast<double>(v->events_checked) / 1e6));

    auto id = reader->identity();
    if (!id) return 1;
    std::ofstream null("/dev/null");
    t = Clock::now();
    auto n = journal::export_jsonl(*reader, {}, *id, null);
    double export_s = ms_since(t) / 1000;
    if (!n) return 1;
    std::printf("export (audit export's path, jsonl to /dev/null): %lld events in %.2f s = %.0f "
                "events/s (target >= 100k/s, ratio %.2f)\n",
                static_cast<long long>(*n), export_s, static_cast<double>(*n) / export_s,
                static_cast<double>(*n) / export_s / 100000);
    // An incremental export (--after) of the last 1000 events starts at its event, not at 1.
    journal::Filter tail;
    tail.after_seq = std::max<std::int64_t>(0, *n - 1000);
    t = Clock::now();
    auto m = journal::export_jsonl(*reader, tail, *id, null);
    if (!m) return 1;
    std::printf("export --after (the last %lld events): %.2f ms\n", static_cast<long long>(*m),
                ms_since(t));
    if (!keep)
        for (auto suffix : {"", "-wal", "-shm", ".anchor"})
            std::filesystem::remove(path + suffix);
    return 0;
}
