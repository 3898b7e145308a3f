#include "journal/system_journal.h"

#include "journal/reader.h"
#include "journal/records.h"
#include "journal/retention.h"

#include <pwd.h>
#include <sys/stat.h>
#include <systemd/sd-journal.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <tuple>

namespace knod::journal {
namespace {

constexpr std::int64_t hour_us = 3600LL * 1000000;

struct JournalCloser {
    void operator()(sd_journal *j) const { sd_journal_close(j); }
};
using JournalPtr = std::unique_ptr<sd_journal, JournalCloser>;

std::string errno_text(int negative) {
    return std::strerror(-negative);
}

// The value of FIELD in the current entry; nullopt when absent.
std::optional<std::string> field(sd_journal *j, const char *name) {
    const void *data = nullptr;
    size_t size = 0;
    if (sd_journal_get_data(j, name, &data, &size) < 0) return std::nullopt;
    std::string_view v(static_cast<const char *>(data), size);
    std::size_t skip = std::strlen(name) + 1; // "NAME="
    if (v.size() < skip) return std::nullopt;
    return std::string(v.substr(skip));
}

bool is_hex64(const std::string &h) {
    return h.size() == 64 && std::all_of(h.begin(), h.end(), [](unsigned char c) {
               return std::isxdigit(c) && !std::isupper(c);
           });
}

bool is_run_id(const std::string &r) {
    return r.size() == 32 && std::all_of(r.begin(), r.end(), [](unsigned char c) {
               return std::isxdigit(c) && !std::isupper(c);
           });
}

// Who may have sent a chain head: root and the daemon's account. Anyone may send journald
// entries with any KNOD_* fields, but _UID is journald's own (from the socket's credentials).
std::set<std::string> trusted_uids(const std::optional<std::string> &daemon_uid) {
    std::set<std::string> uids{"0"};
    if (daemon_uid)
        uids.insert(*daemon_uid);
    else if (struct passwd *pw = getpwnam("knod-policy"))
        uids.insert(std::to_string(pw->pw_uid));
    return uids;
}

} // namespace

std::string SystemJournalSource::describe() const {
    if (!directory.empty()) return "the journal files in " + directory;
    if (files.empty()) return "the system journal";
    std::string out = "the journal file" + std::string(files.size() > 1 ? "s " : " ");
    for (std::size_t i = 0; i < files.size(); ++i)
        out += (i ? ", " : "") + files[i];
    return out;
}

Result<std::vector<AnchorCopy>> read_anchor_copies(const SystemJournalSource &source,
                                                   const std::string &journal_id,
                                                   OtherHeads *others) {
    sd_journal *raw = nullptr;
    int rc = 0;
    if (!source.directory.empty()) {
        rc = sd_journal_open_directory(&raw, source.directory.c_str(), 0);
    } else if (!source.files.empty()) {
        // sd_journal_open_files skips nothing silently only if each file is checked first.
        for (auto &f : source.files) {
            struct stat st {};
            if (::stat(f.c_str(), &st) != 0)
                return make_error(errno == ENOENT ? Errc::not_found : Errc::io,
                                  "cannot read the journal file " + f + ": " +
                                      std::strerror(errno));
        }
        std::vector<const char *> paths;
        for (auto &f : source.files)
            paths.push_back(f.c_str());
        paths.push_back(nullptr);
        rc = sd_journal_open_files(&raw, paths.data(), 0);
    } else {
        rc = sd_journal_open(&raw, 0);
    }
    if (rc < 0)
        return make_error(Errc::io, "cannot open " + source.describe() + ": " + errno_text(rc));
    JournalPtr j(raw);
    // Files that do not open (permissions, not journal files) are skipped by libsystemd; none
    // opened at all means nothing was read, which is not the same as "no copies".
    uint64_t usage = 0;
    if (sd_journal_get_usage(j.get(), &usage) < 0 || usage == 0)
        return make_error(Errc::io,
                          "cannot read " + source.describe() + ": no journal file" +
                              (source.local() ? " readable by this user in /var/log/journal or "
                                                "/run/log/journal (is journald running? members of "
                                                "systemd-journal or adm may read it)"
                                              : " could be read there"));
    std::string id_match = "KNOD_JOURNAL_ID=" + journal_id;
    std::string kind_match = std::string("KNOD_EVENT=") + kind::anchor;
    if ((!others && (rc = sd_journal_add_match(j.get(), id_match.c_str(), 0)) < 0) ||
        (rc = sd_journal_add_match(j.get(), kind_match.c_str(), 0)) < 0)
        return make_error(Errc::io, "journal match: " + errno_text(rc));
    auto trusted = trusted_uids(source.daemon_uid);
    std::vector<AnchorCopy> out;
    // Other journals, by (id, path, host); bounded: a collector holds a few per host, and
    // more is reported (truncated), never silently dropped.
    std::map<std::tuple<std::string, std::string, std::string>, OtherJournal> seen;
    for (;;) {
        rc = sd_journal_next(j.get());
        if (rc < 0)
            return make_error(Errc::io, "reading " + source.describe() + ": " + errno_text(rc));
        if (rc == 0) break;
        auto uid = field(j.get(), "_UID");
        if (!uid || !trusted.count(*uid)) { // sent by another user: not the daemon's
            if (others && uid && field(j.get(), "KNOD_JOURNAL_ID") == journal_id &&
                (others->untrusted_senders.size() < 64 || others->untrusted_senders.count(*uid)))
                ++others->untrusted_senders[*uid];
            continue;
        }
        auto seq = field(j.get(), "KNOD_SEQ");
        auto hash = field(j.get(), "KNOD_HASH");
        AnchorCopy c;
        if (!seq || !hash || !is_hex64(*hash)) continue;
        auto [end, ec] = std::from_chars(seq->data(), seq->data() + seq->size(), c.seq);
        if (ec != std::errc() || end != seq->data() + seq->size() || c.seq < 1) continue;
        c.hash = *hash;
        uint64_t t = 0;
        if (sd_journal_get_realtime_usec(j.get(), &t) >= 0) c.at_us = static_cast<std::int64_t>(t);
        c.journal_path = field(j.get(), "KNOD_JOURNAL_PATH").value_or("");
        c.machine_id = field(j.get(), "_MACHINE_ID").value_or("");
        // Numbered heads (#52): both fields or neither; a malformed number is not a number.
        auto run = field(j.get(), "KNOD_HEAD_RUN");
        auto n = field(j.get(), "KNOD_HEAD_N");
        if (run && n && is_run_id(*run)) {
            std::int64_t v = 0;
            auto [e, err] = std::from_chars(n->data(), n->data() + n->size(), v);
            if (err == std::errc() && e == n->data() + n->size() && v >= 1) {
                c.run = *run;
                c.head_n = v;
            }
        }
        auto id = field(j.get(), "KNOD_JOURNAL_ID");
        if (id && *id == journal_id) {
            out.push_back(std::move(c));
            continue;
        }
        std::tuple key{id.value_or(""), c.journal_path, c.machine_id};
        if (!others || !id) continue;
        if (seen.size() >= max_other_journals && !seen.count(key)) {
            others->truncated = true;
            continue;
        }
        auto &o = seen[key];
        o.journal_id = *id;
        o.journal_path = c.journal_path;
        o.machine_id = c.machine_id;
        ++o.records;
        o.newest_seq = std::max(o.newest_seq, c.seq);
        o.newest_at_us = std::max(o.newest_at_us, c.at_us);
    }
    if (others)
        for (auto &[key, o] : seen)
            others->journals.push_back(std::move(o));
    return out;
}

std::vector<OtherJournal> other_journals_on_host(const std::vector<AnchorCopy> &copies,
                                                 const std::vector<OtherJournal> &others,
                                                 const std::vector<std::string> &expected) {
    std::set<std::string> hosts; // this journal's hosts; "" (no _MACHINE_ID) is every host
    for (auto &c : copies)
        hosts.insert(c.machine_id);
    std::vector<OtherJournal> out;
    for (auto &o : others)
        if ((hosts.count("") || o.machine_id.empty() || hosts.count(o.machine_id)) &&
            std::find(expected.begin(), expected.end(), o.journal_id) == expected.end())
            out.push_back(o);
    return out;
}

Result<SystemJournalCheck> check_anchor_copies(Database &db, const std::string &db_path,
                                               const std::vector<AnchorCopy> &copies,
                                               bool allow_pruned,
                                               std::optional<std::int64_t> retention_us,
                                               std::optional<std::int64_t> snapshot_at_us,
                                               const std::vector<PruneRecord> &prunes) {
    const std::int64_t now = now_us();
    if (sqlite3_get_autocommit(db.get()))
        if (auto r = db.exec("BEGIN"); !r) return std::move(r).error().context(db_path);
    auto first = db.scalar("SELECT coalesce(min(seq), 0) FROM events");
    if (!first) return std::move(first).error().context(db_path + ": not a knod journal");
    auto last = db.scalar("SELECT coalesce(max(seq), 0) FROM events");
    if (!last) return last.error();
    auto st = db.prepare("SELECT hash FROM events WHERE seq = ?");
    if (!st) return st.error();
    auto has_checkpoints = db.scalar(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'checkpoints'");
    if (!has_checkpoints) return has_checkpoints.error();
    std::optional<Statement> cp_st;
    if (*has_checkpoints) {
        auto p = db.prepare("SELECT hash FROM checkpoints WHERE seq = ? AND typeof(hash) = 'blob'");
        if (!p) return p.error();
        cp_st.emplace(std::move(*p));
    }

    SystemJournalCheck check;
    std::map<std::int64_t, std::int64_t> pruned_at; // each pruned seq: its latest copy's time
    check.records = static_cast<std::int64_t>(copies.size());
    const AnchorCopy *beyond = nullptr; // the highest copy past the end
    const AnchorCopy *rewritten = nullptr;
    auto matches = [](Statement &q, const AnchorCopy &c) {
        Hash h{};
        std::string blob = q.blob(0);
        if (blob.size() != h.size()) return false;
        std::copy(blob.begin(), blob.end(), h.begin());
        return to_hex(h) == c.hash;
    };
    for (auto &c : copies) {
        if (!check.newest || c.seq > check.newest->seq ||
            (c.seq == check.newest->seq && c.at_us > check.newest->at_us))
            check.newest = c;
        if (c.seq > *last) {
            if (snapshot_at_us && c.at_us >= *snapshot_at_us)
                ++check.newer_than_snapshot;
            else if (!beyond || c.seq > beyond->seq)
                beyond = &c;
            continue;
        }
        if (c.seq < *first) {
            ++check.pruned;
            // The latest copy: a head sent after the node was taken can carry any time, and
            // only an earlier one would make the event look old enough.
            auto [at, fresh] = pruned_at.emplace(c.seq, c.at_us);
            if (!fresh) at->second = std::max(at->second, c.at_us);
            if (!cp_st) continue;
            // Pruned through exactly its seq: the checkpoint must be that event. A match proves
            // nothing more (heads are public), so the copy stays a pruned one below.
            cp_st->reset();
            cp_st->bind(1, c.seq);
            auto row = cp_st->step();
            if (!row) return row.error();
            if (*row && !matches(*cp_st, c) && !rewritten) rewritten = &c;
            continue;
        }
        st->reset();
        st->bind(1, c.seq);
        auto row = st->step();
        if (!row) return row.error();
        if (!*row || !matches(*st, c)) { // a hole in the middle cannot match either
            if (!rewritten) rewritten = &c;
            continue;
        }
        ++check.compared;
    }
    auto fail = [&](std::int64_t seq, std::string why) {
        check.ok = false;
        check.bad_seq = seq;
        check.problem = std::move(why);
    };
    check.last_event = *last;
    // Each run's numbers: a gap between two heads journald holds is heads it did not keep. Before
    // the lowest it holds is not a gap: journald's vacuum removes the oldest files first.
    {
        std::map<std::string, std::map<std::int64_t, std::int64_t>> runs; // run: n -> seq
        for (auto &c : copies)
            if (c.head_n > 0) runs[c.run].emplace(c.head_n, c.seq);
        check.runs = static_cast<std::int64_t>(runs.size());
        // A run's daemon-stop says how many heads it sent (#52): those after the newest one
        // journald holds are missing too. Only for runs journald holds a head of (a run it
        // holds none of may be older than its vacuum).
        auto stops = db.prepare(
            "SELECT seq, json_extract(detail, '$.heads.run'), json_extract(detail, "
            "'$.heads.sent') FROM events WHERE kind = 'daemon-stop' AND json_valid(detail) AND "
            "json_type(detail, '$.heads.sent') = 'integer'");
        if (!stops) return stops.error();
        while (true) {
            auto row = stops->step();
            if (!row) return row.error();
            if (!*row) break;
            auto it = runs.find(stops->text(1));
            if (it == runs.end() || it->second.empty()) continue;
            auto newest = std::prev(it->second.end());
            std::int64_t sent = stops->int64(2);
            if (sent <= newest->first) continue;
            ++check.missing_ranges;
            check.missing_heads += sent - newest->first;
            if (check.missing.size() < max_missing_listed)
                check.missing.push_back(
                    {it->first, newest->first + 1, sent, newest->second, stops->int64(0), true});
        }
        for (auto &[run, heads] : runs) {
            auto prev = heads.begin();
            for (auto it = std::next(prev); it != heads.end(); prev = it++) {
                if (it->first == prev->first + 1) continue;
                ++check.missing_ranges;
                check.missing_heads += it->first - prev->first - 1;
                if (check.missing.size() < max_missing_listed)
                    check.missing.push_back(
                        {run, prev->first + 1, it->first - 1, prev->second, it->second, false});
            }
        }
        // Oldest first, by the events around them.
        std::sort(check.missing.begin(), check.missing.end(),
                  [](const MissingHeads &a, const MissingHeads &b) {
                      return std::tie(a.after_seq, a.run, a.first) <
                             std::tie(b.after_seq, b.run, b.first);
                  });
    }
    const AnchorCopy *future = nullptr;
    for (auto &c : copies)
        if (static_cast<wide_int>(c.at_us) > static_cast<wide_int>(now) + hour_us &&
            (!future || c.at_us > future->at_us))
            future = &c;
    if (future) {
        fail(future->seq, "journald received the head of event " + std::to_string(future->seq) +
                              " at at_us " + std::to_string(future->at_us) + ", " +
                              age_text(static_cast<std::int64_t>(std::min<wide_int>(
                                  static_cast<wide_int>(future->at_us) - now, INT64_MAX))) +
                              " after this clock's now: the node's clock was set forward (or "
                              "this one is wrong), and such times prove nothing");
    } else if (beyond) {
        fail(beyond->seq, "the system journal recorded event " + std::to_string(beyond->seq) +
                              " of this journal as its head" +
                              (snapshot_at_us ? " before this snapshot was taken" : "") +
                              ", but the " + (snapshot_at_us ? "snapshot" : "journal") +
                              " ends at event " + std::to_string(*last) +
                              ": its tail was removed (truncated, or rolled back with its anchor)");
    } else if (rewritten) {
        fail(rewritten->seq, "event " + std::to_string(rewritten->seq) +
                                 (rewritten->seq < *first ? " (its retention checkpoint)" : "") +
                                 " differs from the head the system journal recorded for it "
                                 "(rewritten)");
    } else if (!pruned_at.empty() && !allow_pruned && retention_us) {
        for (auto &[seq, at] : pruned_at) {
            std::string head = "the system journal recorded event " + std::to_string(seq) +
                               " of this journal as its head (journald's time: at_us " +
                               std::to_string(at) + "), but it is no longer in the journal; ";
            auto by = std::find_if(prunes.begin(), prunes.end(), [s = seq](const PruneRecord &p) {
                return p.pruned_through >= s;
            });
            if (by == prunes.end()) {
                fail(seq, head +
                              "no retention-prune in the chain removed it: it cannot be "
                              "checked against --retention " +
                              age_text(*retention_us));
                break;
            }
            if (static_cast<wide_int>(at) + *retention_us > static_cast<wide_int>(now)) {
                fail(seq, head + "journald received it " +
                              age_text(static_cast<std::int64_t>(static_cast<wide_int>(now) - at)) +
                              " ago, younger than --retention " + age_text(*retention_us) +
                              ": a retention that keeps that long cannot have pruned it yet (a "
                              "wipe and rewrite)");
                break;
            }
            ++check.pruned_by_retention;
        }
    } else if (!pruned_at.empty() && !allow_pruned) {
        auto seq = pruned_at.begin()->first;
        fail(seq, "the system journal recorded event " + std::to_string(seq) +
                      " of this journal as its head, but it is no longer in the journal (its "
                      "first event is " +
                      std::to_string(*first) +
                      "): it cannot be compared, and a wipe and rewrite of all history looks the "
                      "same, even on a checkpoint that holds its hash (heads are public) (pass "
                      "--allow-pruned-anchor or --retention AGE if that prune is expected)");
    }
    if (check.ok && !check.missing.empty()) {
        const MissingHeads &m = check.missing.front();
        auto range = [](std::int64_t a, std::int64_t b) {
            return a == b ? "head " + std::to_string(a)
                          : "heads " + std::to_string(a) + ".." + std::to_string(b);
        };
        fail(m.after_seq + 1,
             "the system journal's newest head is event " +
                 std::to_string(check.newest ? check.newest->seq : 0) + " of " +
                 std::to_string(*last) + ", but " + range(m.first, m.last) + " of daemon run " +
                 m.run +
                 (m.tail ? " (sent after the head of event " + std::to_string(m.after_seq) +
                               "; its daemon-stop, event " + std::to_string(m.before_seq) +
                               ", says it sent " + std::to_string(m.last) + ")"
                         : " (sent between the heads of events " + std::to_string(m.after_seq) +
                               " and " + std::to_string(m.before_seq) + ")") +
                 " are missing" +
                 (check.missing_ranges > 1
                      ? " (" + std::to_string(check.missing_heads) + " head(s) in " +
                            std::to_string(check.missing_ranges) + " gap(s) in all)"
                      : std::string()) +
                 ": journald did not keep them (its rate limit, its disk) or they were removed, "
                 "so a cut of the events they covered would not be seen");
    }
    return check;
}

} // namespace knod::journal
