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

namespace knod::journal {
namespace {

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

// Who may have sent a chain head: root and the daemon's account. Anyone may send journald
// entries with any KNOD_* fields, but _UID is journald's own (from the socket's credentials).
std::set<std::string> trusted_uids() {
    std::set<std::string> uids{"0"};
    if (struct passwd *pw = getpwnam("knod-policy")) uids.insert(std::to_string(pw->pw_uid));
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
                                                   const std::string &journal_id) {
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
    if ((rc = sd_journal_add_match(j.get(), id_match.c_str(), 0)) < 0 ||
        (rc = sd_journal_add_match(j.get(), kind_match.c_str(), 0)) < 0)
        return make_error(Errc::io, "journal match: " + errno_text(rc));
    auto trusted = trusted_uids();
    std::vector<AnchorCopy> out;
    for (;;) {
        rc = sd_journal_next(j.get());
        if (rc < 0)
            return make_error(Errc::io, "reading " + source.describe() + ": " + errno_text(rc));
        if (rc == 0) break;
        auto uid = field(j.get(), "_UID");
        if (!uid || !trusted.count(*uid)) continue; // sent by another user: not the daemon's
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
        out.push_back(std::move(c));
    }
    return out;
}

Result<SystemJournalCheck> check_anchor_copies(Database &db, const std::string &db_path,
                                               const std::vector<AnchorCopy> &copies,
                                               bool allow_pruned,
                                               std::optional<std::int64_t> retention_us,
                                               std::optional<std::int64_t> snapshot_at_us) {
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
    const AnchorCopy *uncompared = nullptr; // the lowest copy of a pruned event, no checkpoint
    std::map<std::int64_t, std::int64_t> uncompared_at; // each such seq: its earliest copy's time
    check.records = static_cast<std::int64_t>(copies.size());
    const AnchorCopy *beyond = nullptr; // the highest copy past the end
    const AnchorCopy *rewritten = nullptr;
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
        Statement *q = &*st;
        if (c.seq < *first) {
            ++check.pruned;
            if (!cp_st) {
                if (!uncompared || c.seq < uncompared->seq) uncompared = &c;
                uncompared_at.emplace(c.seq, c.at_us);
                continue;
            }
            q = &*cp_st; // the checkpoint at its seq, if retention stopped exactly there
            q->reset();
            q->bind(1, c.seq);
            auto row = q->step();
            if (!row) return row.error();
            if (!*row) {
                if (!uncompared || c.seq < uncompared->seq) uncompared = &c;
                auto [at, fresh] = uncompared_at.emplace(c.seq, c.at_us);
                if (!fresh) at->second = std::min(at->second, c.at_us);
                continue;
            }
            --check.pruned;
        } else {
            st->reset();
            st->bind(1, c.seq);
        }
        auto row = c.seq < *first ? Result<bool>(true) : st->step();
        if (!row) return row.error();
        if (!*row) { // a hole in the middle: the chain check names it; here it cannot match
            if (!rewritten) rewritten = &c;
            continue;
        }
        Hash h{};
        std::string blob = q->blob(0);
        if (blob.size() == h.size()) std::copy(blob.begin(), blob.end(), h.begin());
        if (blob.size() != h.size() || to_hex(h) != c.hash) {
            if (!rewritten) rewritten = &c;
            continue;
        }
        ++check.compared;
    }
    if (beyond) {
        check.ok = false;
        check.bad_seq = beyond->seq;
        check.problem = "the system journal recorded event " + std::to_string(beyond->seq) +
                        " of this journal as its head" +
                        (snapshot_at_us ? " before this snapshot was taken" : "") + ", but the " +
                        (snapshot_at_us ? "snapshot" : "journal") + " ends at event " +
                        std::to_string(*last) +
                        ": its tail was removed (truncated, or rolled back with its anchor)";
    } else if (rewritten) {
        check.ok = false;
        check.bad_seq = rewritten->seq;
        check.problem = "event " + std::to_string(rewritten->seq) +
                        (rewritten->seq < *first ? " (its retention checkpoint)" : "") +
                        " differs from the head the system journal recorded for it (rewritten)";
    } else if (uncompared && !allow_pruned && retention_us) {
        // Each pruned copy against the prune that removed it: the first checkpoint at or above.
        std::optional<Statement> by;
        if (cp_st) {
            auto p = db.prepare("SELECT seq, pruned_at_us FROM checkpoints WHERE seq >= ? AND "
                                "typeof(pruned_at_us) = 'integer' ORDER BY seq LIMIT 1");
            if (!p) return p.error();
            by.emplace(std::move(*p));
        }
        for (auto &[seq, at] : uncompared_at) {
            std::optional<std::int64_t> cp_seq, pruned_at;
            if (by) {
                by->reset();
                by->bind(1, seq);
                auto row = by->step();
                if (!row) return row.error();
                if (*row) cp_seq = by->int64(0), pruned_at = by->int64(1);
            }
            if (pruned_at &&
                static_cast<wide_int>(at) + *retention_us <= static_cast<wide_int>(*pruned_at)) {
                ++check.pruned_by_retention;
                continue;
            }
            check.ok = false;
            check.bad_seq = seq;
            check.problem =
                "the system journal recorded event " + std::to_string(seq) +
                " of this journal as its head (journald's time: at_us " + std::to_string(at) +
                "), but it is no longer in the journal and no retention checkpoint records it; " +
                (pruned_at ? "the prune that removed it (checkpoint at event " +
                                 std::to_string(*cp_seq) + ") came " +
                                 age_text(static_cast<std::int64_t>(
                                     static_cast<wide_int>(*pruned_at) - at)) +
                                 " later, younger than --retention " + age_text(*retention_us) +
                                 ": a prune the auditor does not expect, or a wipe and rewrite"
                           : std::string("no checkpoint tells when it was pruned: it cannot be "
                                         "checked against --retention ") +
                                 age_text(*retention_us));
            break;
        }
    } else if (uncompared && !allow_pruned) {
        check.ok = false;
        check.bad_seq = uncompared->seq;
        check.problem =
            "the system journal recorded event " + std::to_string(uncompared->seq) +
            " of this journal as its head, but it is no longer in the journal (its first event "
            "is " +
            std::to_string(*first) +
            ") and no retention checkpoint records it: it cannot be compared, and a wipe and "
            "rewrite of all history looks the same (pass --allow-pruned-anchor or --retention AGE "
            "if that prune is expected)";
    }
    return check;
}

} // namespace knod::journal
