#include "daemon/journal/verify.h"

#include "daemon/journal/reader.h"
#include "daemon/journal/records.h"
#include "daemon/journal/sqlite.h"
#include "daemon/journal/table_check.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

namespace knod::journal {
namespace {

bool to_hash(const std::string &blob, Hash &out) {
    if (blob.size() != out.size()) return false;
    std::copy(blob.begin(), blob.end(), out.begin());
    return true;
}

struct Anchor {
    std::int64_t seq = 0;
    std::string hash;
};

// The anchor file as the daemon writes it: {"seq": N, "hash": "<64 hex digits>"}. Absent is
// nullopt; anything else that is not exactly that is an error naming the file.
Result<std::optional<Anchor>> read_anchor(const std::string &path) {
    std::ifstream in(path);
    if (!in) {
        if (errno == ENOENT) return std::optional<Anchor>();
        return make_error(Errc::io,
                          "cannot read the anchor file " + path + ": " + std::strerror(errno));
    }
    auto bad = [&](const std::string &why) {
        return make_error(Errc::corrupt, "the anchor file " + path + " is malformed: " + why);
    };
    auto j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_object()) return bad("not a JSON object");
    auto seq = j.find("seq");
    auto hash = j.find("hash");
    if (seq == j.end() || !seq->is_number_integer() || seq->get<std::int64_t>() < 1)
        return bad("\"seq\" is not a positive integer");
    if (hash == j.end() || !hash->is_string()) return bad("\"hash\" is not a string");
    auto h = hash->get<std::string>();
    if (h.size() != 64 || !std::all_of(h.begin(), h.end(),
                                       [](char c) { return std::isxdigit(c) && !std::isupper(c); }))
        return bad("\"hash\" is not 64 lowercase hex digits");
    return std::optional<Anchor>(Anchor{seq->get<std::int64_t>(), h});
}

// Checkpoints left by retention: the last pruned event's seq -> its hash.
Result<std::map<std::int64_t, Hash>> read_checkpoints(Database &db) {
    std::map<std::int64_t, Hash> out;
    auto has = db.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'checkpoints'");
    if (!has) return has.error();
    if (*has == 0) return out;
    auto st = db.prepare("SELECT seq, hash FROM checkpoints");
    if (!st) return st.error();
    for (;;) {
        auto row = st->step();
        if (!row) return row.error();
        if (!*row) return out;
        Hash h{};
        if (to_hash(st->blob(1), h)) out[st->int64(0)] = h;
    }
}

} // namespace

Result<VerifyReport> verify_chain(const std::string &path, const VerifyProgress &progress,
                                  const std::string &anchor_file, AnchorUse use) {
    auto journal = ReadOnlyJournal::open(path);
    if (!journal) return journal.error();
    Database *db = &journal->db();
    // One read transaction, so a live daemon appending meanwhile does not move the ground.
    if (auto r = db->exec("BEGIN"); !r) return std::move(r).error().context(path);
    auto total = db->scalar("SELECT count(*) FROM events");
    if (!total) return std::move(total).error().context(path + ": not a knod journal");
    auto checkpoints = read_checkpoints(*db);
    if (!checkpoints) return checkpoints.error();
    auto st = db->prepare("SELECT seq, at_us, kind, session_id, uid, pid, rule, decision, reason, "
                          "detail, prev_hash, hash FROM events ORDER BY seq");
    if (!st) return st.error();
    auto tables = TableCheck::open(*db);
    if (!tables) return std::move(tables).error().context(path);

    std::string anchor_path_used = anchor_file.empty() ? anchor_path(path) : anchor_file;
    std::optional<Anchor> anchor;
    if (use != AnchorUse::ignore) {
        auto read = read_anchor(anchor_path_used);
        if (!read) return read.error();
        if (!*read && !anchor_file.empty())
            return make_error(Errc::not_found, "no anchor file " + anchor_file);
        anchor = *read;
    }

    VerifyReport report;
    report.total_events = *total;
    Hash prev{};
    std::int64_t expected = 1;
    std::set<std::int64_t> pruned_through; // checkpoints the chain itself vouches for
    std::optional<std::int64_t> checkpoint_used;
    std::string anchor_seen_hash;
    auto fail = [&](std::int64_t seq, std::string why) {
        report.ok = false;
        report.first_bad_seq = seq;
        report.problem = std::move(why);
    };
    bool first_row = true;
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
        if (first_row) {
            first_row = false;
            report.first_seq = seq;
            if (seq > 1) {
                // Retention removed the oldest events: a checkpoint must anchor the rest.
                auto cp = checkpoints->find(seq - 1);
                if (cp == checkpoints->end()) {
                    fail(seq,
                         "events 1-" + std::to_string(seq - 1) +
                             " are missing (deleted) and no retention checkpoint anchors the rest");
                    break;
                }
                prev = cp->second;
                expected = seq;
                checkpoint_used = seq - 1;
            }
        }
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
        if (e.kind == kind::prune && e.detail) {
            auto d = nlohmann::json::parse(*e.detail, nullptr, false);
            if (d.is_object() && d.contains("pruned_through"))
                pruned_through.insert(d["pruned_through"].get<std::int64_t>());
        }
        if (anchor && seq == anchor->seq) anchor_seen_hash = to_hex(stored);
        if (auto t = (*tables)->event(seq, e); !t) return std::move(t).error().context(path);
        prev = stored;
        ++expected;
        ++report.events_checked;
        if (progress && report.events_checked % 65536 == 0)
            progress(report.events_checked, report.total_events);
    }
    if (progress) progress(report.events_checked, report.total_events);
    report.head_hash = to_hex(prev);
    if (report.ok && checkpoint_used && !pruned_through.count(*checkpoint_used))
        fail(report.first_seq,
             "the checkpoint at event " + std::to_string(*checkpoint_used) +
                 " was not made by a retention-prune event in the chain (forged)");
    if (report.ok && anchor) {
        std::int64_t last = expected - 1;
        report.anchor_seq = anchor->seq;
        if (anchor->seq > last) {
            fail(last + 1, "the journal ends at event " + std::to_string(last) +
                               " but its anchor (" + anchor_path_used + ") records event " +
                               std::to_string(anchor->seq) + ": the tail was removed (truncated)");
        } else if (anchor->seq >= report.first_seq && anchor_seen_hash != anchor->hash) {
            fail(anchor->seq, "event " + std::to_string(anchor->seq) +
                                  " differs from the anchor kept outside the database (rewritten)");
        } else {
            report.anchor_checked = anchor->seq >= report.first_seq;
        }
    } else if (report.ok && use == AnchorUse::require) {
        // The daemon writes the anchor after every commit that adds events; without it a
        // truncated tail looks like a whole chain. A copy taken without it needs --no-anchor.
        fail(expected, "no anchor file " + anchor_path_used +
                           " beside the journal: a truncated tail could not be found (deleted "
                           "anchor?); copy the anchor with the journal, name it with --anchor, "
                           "or check the chain alone with --no-anchor");
    }
    report.chain_intact = report.ok;
    if (report.ok) {
        if (auto t = (*tables)->finish(report.first_seq); !t)
            return std::move(t).error().context(path);
        if (auto &p = (*tables)->problem()) fail(p->seq, p->what);
        auto &n = (*tables)->counts();
        report.sessions_checked = n.sessions_checked;
        report.sessions_not_covered = n.sessions_not_covered;
        report.policies_checked = n.policies_checked;
    }
    return report;
}

} // namespace knod::journal
