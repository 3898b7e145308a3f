#include "daemon/journal/verify.h"

#include "daemon/journal/records.h"
#include "daemon/journal/sqlite.h"

#include <algorithm>

namespace knod::journal {
namespace {

bool to_hash(const std::string &blob, Hash &out) {
    if (blob.size() != out.size()) return false;
    std::copy(blob.begin(), blob.end(), out.begin());
    return true;
}

} // namespace

Result<VerifyReport> verify_chain(const std::string &path, const VerifyProgress &progress) {
    auto db = Database::open("file:" + path + "?mode=ro", SQLITE_OPEN_READONLY | SQLITE_OPEN_URI);
    if (!db) return db.error();
    // One read transaction, so a live daemon appending meanwhile does not move the ground.
    if (auto r = db->exec("BEGIN"); !r) return std::move(r).error().context(path);
    auto total = db->scalar("SELECT count(*) FROM events");
    if (!total) return std::move(total).error().context(path + ": not a knod journal");
    auto st = db->prepare("SELECT seq, at_us, kind, session_id, uid, pid, rule, decision, reason, "
                          "detail, prev_hash, hash FROM events ORDER BY seq");
    if (!st) return st.error();

    VerifyReport report;
    report.total_events = *total;
    Hash prev{};
    std::int64_t expected = 1;
    auto fail = [&](std::int64_t seq, std::string why) {
        report.ok = false;
        report.first_bad_seq = seq;
        report.problem = std::move(why);
    };
    for (;;) {
        auto row = st->step();
        if (!row) return std::move(row).error().context(path);
        if (!*row) break;
        std::int64_t seq = st->int64(0);
        Event e;
        e.at_us = st->int64(1);
        e.kind = st->text(2);
        e.session_id = st->opt_text(3);
        e.uid = st->opt_int64(4);
        e.pid = st->opt_int64(5);
        e.rule = st->opt_text(6);
        e.decision = st->opt_text(7);
        e.reason = st->opt_text(8);
        e.detail = st->opt_text(9);
        Hash stored_prev{}, stored{};
        if (seq != expected) {
            fail(seq, seq > expected
                          ? "event " + std::to_string(seq) + " follows event " +
                                std::to_string(expected - 1) + ": event(s) " +
                                std::to_string(expected) +
                                (seq - 1 > expected ? "-" + std::to_string(seq - 1) : "") +
                                " are missing (deleted)"
                          : "event " + std::to_string(seq) + " is out of sequence (inserted)");
            break;
        }
        if (!to_hash(st->blob(10), stored_prev) || !to_hash(st->blob(11), stored)) {
            fail(seq, "event " + std::to_string(seq) + " has a malformed hash");
            break;
        }
        if (stored_prev != prev) {
            fail(seq,
                 "event " + std::to_string(seq) +
                     " does not chain to the event before it (inserted, deleted or reordered)");
            break;
        }
        if (chain_hash(prev, seq, e) != stored) {
            fail(seq, "event " + std::to_string(seq) + " does not match its hash (edited)");
            break;
        }
        prev = stored;
        ++expected;
        ++report.events_checked;
        if (progress && report.events_checked % 65536 == 0)
            progress(report.events_checked, report.total_events);
    }
    if (progress) progress(report.events_checked, report.total_events);
    report.head_hash = to_hex(prev);
    return report;
}

} // namespace knod::journal
