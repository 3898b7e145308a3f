// knod-policy audit: what security teams ask of the session journal, on a live host or on a
// copy gathered from another node. Everything here opens the journal read-only.
#include "cli/audit_export.h"
#include "cli/audit_format.h"
#include "cli/audit_report.h"
#include "cli/commands.h"
#include "journal/export.h"
#include "journal/reader.h"
#include "journal/system_journal.h"
#include "journal/verify.h"
#include "journal/vocabulary.h"
#include "knod/json.h"
#include "knod/untrusted.h"
#include "policy/parser.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>

namespace knod::cli {
namespace {

constexpr const char *default_db = "/var/lib/knod-policy/journal.db";

struct Options {
    std::string db = default_db;
    bool json = false, csv = false;
    std::string since, until, user, netdev, gpu, rule, decision, reason, kind;
    std::int64_t limit = 0, last = 0;
    std::string session;
    std::string html; // report: write the page here
    std::string format = "jsonl";
    std::string table = "events";
    std::string anchor;
    bool no_anchor = false;
    std::string after;       // events after this event id (incremental export)
    std::string export_file; // verify --export
    bool allow_gaps = false;
    bool allow_pruned_anchor = false;
    std::vector<std::string> expect_journals; // other journal ids the auditor knows are there
    std::string daemon_uid;                   // the daemon's uid on the node, if not here
    bool as_snapshot = false; // verify: take the anchor's snapshot mark wherever the file lies
    std::string retention;    // verify --retention AGE: the node prunes only events this old
    // The chain-head copies in the system journal: checked where readable unless
    // --no-system-journal; required (exit 2 when unreadable) when asked for by name.
    bool system_journal = false, no_system_journal = false;
    std::string system_journal_dir;
    std::vector<std::string> system_journal_files;
};

void add_db(CLI::App *cmd, Options &o) {
    cmd->add_option("--db", o.db, "journal database file; a copy works too (nothing is written)")
        ->capture_default_str();
}

std::string joined(const std::vector<std::string> &v) {
    std::string out;
    for (auto &s : v)
        out += (out.empty() ? "" : ", ") + s;
    return out;
}

void add_filters(CLI::App *cmd, Options &o, bool events) {
    cmd->add_option("--since", o.since,
                    "from this time: 2026-11-29, 2026-11-29T10:00Z, or an age like 24h, 7d");
    cmd->add_option("--until", o.until, "before this time (same forms)");
    cmd->add_option("--uid,--user", o.user, "one user, by uid or name");
    cmd->add_option("--netdev", o.netdev, "one network device");
    cmd->add_option("--gpu", o.gpu, "one GPU");
    cmd->add_option("--rule", o.rule, "the deciding policy rule");
    cmd->add_option("--reason", o.reason,
                    events ? "the event's reason (its exact text)"
                           : "why the session ended: " + joined(journal::known_end_reasons()));
    if (events) {
        cmd->add_option("--decision", o.decision, "one of: " + joined(journal::known_decisions()));
        cmd->add_option("--kind", o.kind, "one of: " + joined(journal::known_kinds()));
        cmd->add_option("--after", o.after,
                        "only events after this event id (an export's event_id, "
                        "JOURNAL_ID-SEQ): continues an earlier export");
    }
    auto *limit =
        cmd->add_option("--limit", o.limit, "at most this many rows (1 or more), the oldest first")
            ->check(CLI::Range(std::int64_t{1}, std::numeric_limits<std::int64_t>::max()));
    cmd->add_option("--last", o.last,
                    "the N newest rows that match (1 or more), printed oldest first: a page "
                    "of recent events without reading the whole journal")
        ->check(CLI::Range(std::int64_t{1}, std::numeric_limits<std::int64_t>::max()))
        ->excludes(limit);
}

void add_output(CLI::App *cmd, Options &o) {
    auto *j = cmd->add_flag("--json", o.json, "a JSON array");
    auto *c = cmd->add_flag("--csv", o.csv, "CSV with a header row");
    j->excludes(c);
}

Result<journal::Filter> make_filter(const Options &o, bool events) {
    // A value no event can have is a typo, never an empty answer.
    auto member = [](const std::string &what, const std::string &v,
                     const std::vector<std::string> &accepted) -> Result<void> {
        if (v.empty()) return {};
        if (auto bad = check_member(what, v, accepted))
            return make_error(Errc::invalid_argument, *bad);
        return {};
    };
    if (events) {
        if (auto r = member("kind", o.kind, journal::known_kinds()); !r) return r.error();
        if (auto r = member("decision", o.decision, journal::known_decisions()); !r)
            return r.error();
    } else if (auto r = member("end reason", o.reason, journal::known_end_reasons()); !r) {
        return r.error();
    }
    journal::Filter f;
    std::int64_t now = journal::now_us();
    auto when = [&](const std::string &text,
                    const char *what) -> Result<std::optional<std::int64_t>> {
        if (text.empty()) return std::optional<std::int64_t>();
        auto t = parse_time(text, now);
        if (!t)
            return make_error(Errc::invalid_argument,
                              std::string(what) + ": cannot read time '" + text + "'");
        return std::optional<std::int64_t>(*t);
    };
    auto since = when(o.since, "--since");
    if (!since) return since.error();
    auto until = when(o.until, "--until");
    if (!until) return until.error();
    f.since_us = *since;
    f.until_us = *until;
    if (!o.user.empty()) {
        if (std::all_of(o.user.begin(), o.user.end(), ::isdigit)) {
            std::uint32_t uid = 0; // a uid_t: a larger number is no uid (and stoll would throw)
            auto [end, ec] = std::from_chars(o.user.data(), o.user.data() + o.user.size(), uid);
            if (ec != std::errc() || end != o.user.data() + o.user.size())
                return make_error(Errc::invalid_argument, "--user: no such uid " + o.user);
            f.uid = uid;
        } else if (struct passwd *pw = getpwnam(o.user.c_str())) {
            f.uid = pw->pw_uid;
        } else {
            return make_error(Errc::invalid_argument, "--user: no such user '" + o.user + "'");
        }
    }
    auto set = [](const std::string &v, std::optional<std::string> &out) {
        if (!v.empty()) out = v;
    };
    set(o.netdev, f.netdev);
    set(o.gpu, f.gpu);
    set(o.rule, f.rule);
    set(o.reason, f.reason);
    set(o.decision, f.decision);
    set(o.kind, f.kind);
    if (o.limit > 0) f.limit = o.limit;
    if (o.last > 0) {
        f.limit = o.last;
        f.newest = true;
    }
    return f;
}

// Anything that stops a command before it has an answer (bad input, a journal that cannot be
// read) is exit 2 with the reason; exit 1 is kept for "the journal was tampered with". With
// --json the reason is also a JSON object on stdout, so a script never parses nothing.
int fail(const Options &o, const std::string &what, const Error &e) {
    std::cerr << "knod-policy audit " << what << ": " << e.message << "\n";
    bool tampered = journal::is_tampering(e);
    if (o.json)
        std::cout << knod::dump_json_escaped(nlohmann::json{
                         {"error", e.message}, {"command", what}, {"tampered", tampered}})
                  << "\n";
    return tampered ? exit_failed : exit_usage;
}

// A journal value in a table cell or a `show` line: every control character, newline and tab
// included, as \xNN (the output stream lets newlines through for whole messages).
std::string cell(const std::string &v) {
    return escape_untrusted(v);
}

// Prints rows as a table, a JSON array or CSV, as they stream in.
class Printer {
  public:
    Printer(const Options &o, std::vector<std::string> columns, std::vector<std::size_t> shown)
        : o_(o), columns_(std::move(columns)), shown_(std::move(shown)) {
        if (o_.csv) std::cout << csv_row(columns_) << "\n";
        if (!o_.csv && !o_.json) row(columns_, true);
    }
    void add(const std::string &json_text, const std::vector<std::string> &fields) {
        ++count_;
        if (o_.json)
            std::cout << (count_ > 1 ? ",\n" : "[\n") << json_text;
        else if (o_.csv)
            std::cout << csv_row(fields) << "\n";
        else
            row(fields, false);
    }
    void finish(const char *noun) {
        if (o_.json) std::cout << (count_ ? "\n]\n" : "[]\n");
        if (!o_.json && !o_.csv) std::cout << count_ << " " << noun << "\n";
    }
    // A read that failed part way: before any row the error is the whole JSON output (an
    // object); after some, the array ends with that object, so the output still parses.
    int abort(const std::string &what, const Error &e) {
        if (o_.json && count_) {
            std::cerr << "knod-policy audit " << what << ": " << e.message << "\n";
            std::cout << ",\n"
                      << knod::dump_json_escaped(
                             nlohmann::json{{"error", e.message}, {"command", what}})
                      << "\n]\n";
            return exit_usage;
        }
        return fail(o_, what, e);
    }

  private:
    void row(const std::vector<std::string> &fields, bool header) {
        for (std::size_t i : shown_) {
            // One row per line: a stored newline or tab would forge a row or shift columns.
            std::string v = cell(fields[i]);
            if (header) std::transform(v.begin(), v.end(), v.begin(), ::toupper);
            int width = columns_[i] == "time" ? 27 : 21; // microseconds and zone
            std::cout << std::left << std::setw(i == shown_.back() ? 0 : width) << v << " ";
        }
        std::cout << "\n";
    }
    const Options &o_;
    std::vector<std::string> columns_;
    std::vector<std::size_t> shown_;
    std::size_t count_ = 0;
};

int list_sessions(const Options &o) {
    auto f = make_filter(o, false);
    if (!f) return fail(o, "sessions", f.error());
    auto r = journal::JournalReader::open(o.db);
    if (!r) return fail(o, "sessions", r.error());
    auto id = r->identity();
    if (!id) return fail(o, "sessions", id.error());
    Printer p(o, session_columns, {0, 1, 3, 4, 6, 7, 8, 9, 11});
    auto done = r->sessions(*f, [&](const journal::Session &s) {
        p.add(o.json ? knod::dump_json_escaped(session_json(s, *id)) : std::string(),
              session_row(s));
        return true;
    });
    if (!done) return p.abort("sessions", done.error());
    p.finish("session(s)");
    return exit_ok;
}

// The filter, the journal's identity and --after's seq: what events and export share.
Result<journal::Filter> event_query(const Options &o, journal::JournalReader &r,
                                    const std::string &command, journal::JournalIdentity &id) {
    auto f = make_filter(o, true);
    if (!f) return f.error();
    auto got = record_identity(r, o.db, command);
    if (!got) return got.error();
    id = *got;
    if (!o.after.empty()) {
        auto seq = resume_after(o.after, id, o.db);
        if (!seq) return seq.error();
        f->after_seq = *seq;
    }
    return f;
}

// The table shows these columns of event_columns.
std::vector<std::size_t> shown_event_columns() {
    std::vector<std::size_t> out;
    for (const char *name : {"seq", "time", "kind", "session", "uid", "rule", "decision", "reason"})
        out.push_back(static_cast<std::size_t>(
            std::find(event_columns.begin(), event_columns.end(), name) - event_columns.begin()));
    return out;
}

int list_events(const Options &o) {
    auto r = journal::JournalReader::open(o.db);
    if (!r) return fail(o, "events", r.error());
    journal::JournalIdentity id;
    auto f = event_query(o, *r, "events", id);
    if (!f) return fail(o, "events", f.error());
    Printer p(o, event_columns, shown_event_columns());
    auto done = r->events(*f, [&](const journal::EventRecord &e) {
        p.add(o.json ? journal::export_line(e, id) : std::string(),
              o.json ? std::vector<std::string>() : event_row(e, id));
        return true;
    });
    if (!done) return p.abort("events", done.error());
    p.finish("event(s)");
    return exit_ok;
}

int show(const Options &o) {
    auto r = journal::JournalReader::open(o.db);
    if (!r) return fail(o, "show", r.error());
    auto s = r->session(o.session);
    if (!s) return fail(o, "show", s.error());
    if (!*s) return fail(o, "show", make_error(Errc::not_found, "no session " + o.session));
    journal::Filter f;
    f.session = o.session;
    std::vector<journal::EventRecord> events;
    auto done = r->events(f, [&](const journal::EventRecord &e) {
        events.push_back(e);
        return true;
    });
    if (!done) return fail(o, "show", done.error());
    if (o.json) {
        auto id = r->identity();
        if (!id) return fail(o, "show", id.error());
        nlohmann::json j = session_json(**s, *id);
        j["events"] = nlohmann::json::array();
        for (auto &e : events) { // the export record, with its field order
            std::string line = journal::export_line(e, *id);
            auto record = knod::parse_json(line);
            j["events"].push_back(record.is_discarded() ? nlohmann::json(line) : record);
        }
        std::cout << knod::dump_json_escaped(j, 2) << "\n";
        return exit_ok;
    }
    auto row = session_row(**s);
    for (std::size_t i = 0; i < session_columns.size(); ++i)
        std::cout << std::left << std::setw(16) << session_columns[i] + ":" << cell(row[i]) << "\n";
    std::cout << "events:\n";
    for (auto &e : events)
        std::cout << "  " << e.seq << "  " << format_time(e.event.at_us) << "  "
                  << cell(e.event.kind)
                  << (e.event.reason ? "  (" + cell(*e.event.reason) + ")" : "") << "\n";
    return exit_ok;
}

int report(const Options &o) {
    auto f = make_filter(o, true);
    if (!f) return fail(o, "report", f.error());
    if (auto done = run_report({o.db, *f, o.json, o.html}); !done)
        return fail(o, "report", done.error());
    return exit_ok;
}

int export_rows(const Options &o) {
    auto r = journal::JournalReader::open(o.db);
    if (!r) return fail(o, "export", r.error());
    bool csv = o.format == "csv";
    std::int64_t n = 0;
    Result<void> done;
    if (o.table == "sessions") {
        if (!o.after.empty())
            return fail(o, "export",
                        make_error(Errc::invalid_argument, "--after applies to --table events"));
        auto f = make_filter(o, false);
        if (!f) return fail(o, "export", f.error());
        auto id = r->identity();
        if (!id) return fail(o, "export", id.error());
        if (csv) std::cout << csv_row(session_columns) << "\n";
        done = r->sessions(*f, [&](const journal::Session &s) {
            std::cout << (csv ? csv_row(session_row(s))
                              : knod::dump_json_escaped(session_json(s, *id)))
                      << "\n";
            ++n;
            return true;
        });
    } else {
        journal::JournalIdentity id;
        auto f = event_query(o, *r, "export", id);
        if (!f) return fail(o, "export", f.error());
        if (csv) {
            std::cout << csv_row(event_columns) << "\n";
            done = r->events(*f, [&](const journal::EventRecord &e) {
                std::cout << csv_row(event_row(e, id)) << "\n";
                ++n;
                return true;
            });
        } else if (auto wrote = journal::export_jsonl(*r, *f, id, std::cout); !wrote) {
            done = wrote.error();
        } else {
            n = *wrote;
        }
    }
    if (!done) return fail(o, "export", done.error());
    std::cerr << "exported " << n << " " << o.table << "\n";
    return exit_ok;
}

// What verify checked beside the chain (table_check.h).
void print_tables(const journal::VerifyReport &r) {
    std::cout << "sessions: " << r.sessions_checked
              << " row(s) match the values their grant and closing events carry\n";
    if (r.sessions_not_covered)
        std::cout << "sessions: " << r.sessions_not_covered
                  << " row(s) written by an older build are not covered (their events carry no "
                     "values to compare; their existence is checked)\n";
    std::cout << "policies: " << r.policies_checked
              << " stored text(s) match their digests; every digest a policy load names is "
                 "stored\n";
}

// The system journal's part of verify. `copies` holds this journal's chain-head copies once
// read; without them (skipped, or unreadable and not asked for by name) `note` says why; an
// error when asked for by name and unreadable. `check` is filled once the snapshot is verified.
struct SystemJournalPart {
    std::optional<std::vector<journal::AnchorCopy>> copies;
    std::optional<journal::SystemJournalCheck> check;
    std::string source;
    std::string note;
    bool required = false;      // asked for by name: unreadable or empty is a failure
    std::string journal_id;     // the id its records were matched by
    journal::OtherHeads others; // other journals' heads, when required
};

// Reads the copies before verify takes its snapshot: the daemon sends a head only after
// committing it, so no copy read here can be ahead of an intact database.
Result<SystemJournalPart> read_system_journal(const Options &o, journal::Database &db) {
    SystemJournalPart part;
    journal::SystemJournalSource source{o.system_journal_dir, o.system_journal_files, {}};
    if (!o.daemon_uid.empty()) source.daemon_uid = o.daemon_uid;
    part.source = source.describe();
    bool required = o.system_journal || !source.local();
    part.required = required;
    if (o.no_system_journal) {
        part.note = "not checked (--no-system-journal)";
        // Only for verify --json's journal_id: an unreadable id is verify's to report.
        if (auto id = journal::read_identity(db)) part.journal_id = id->journal_id;
        return part;
    }
    auto unread = [&](const Error &e) -> Result<SystemJournalPart> {
        if (required) return e;
        part.note = "not checked: " + e.message;
        return part;
    };
    auto id = journal::read_identity(db);
    if (!id) return id.error();
    if (id->journal_id.empty()) {
        // Schema 4 makes the id with the table: a newer journal without one had it deleted.
        auto version = db.scalar("PRAGMA user_version");
        if (!version) return version.error();
        if (*version >= 4) // verify reports it as tampering; here it only means unread
            return unread(make_error(
                Errc::corrupt, "the journal has no id in its meta table although its schema "
                               "(version " +
                                   std::to_string(*version) +
                                   ") makes one (deleted: tampered), so its copies in the system "
                                   "journal cannot be found"));
        return unread(make_error(Errc::unsupported,
                                 "the journal has no id (written before schema 4), so its "
                                 "copies in the system journal cannot be told apart"));
    }
    part.journal_id = id->journal_id;
    auto copies =
        journal::read_anchor_copies(source, id->journal_id, required ? &part.others : nullptr);
    if (!copies) return unread(copies.error());
    part.copies = std::move(*copies);
    return part;
}

// The copy's last event (0: none checked).
std::int64_t last_event(const journal::VerifyReport &r) {
    return r.events_checked > 0 ? std::max<std::int64_t>(r.first_seq, 1) + r.events_checked - 1 : 0;
}

// Whether the anchor's snapshot mark is taken (VerifyReport::snapshot_mark).
bool taken_as_snapshot(const Options &o, const journal::VerifyReport &r) {
    return r.snapshot_mark && (o.as_snapshot || journal::at_snapshot_path(o.db, *r.snapshot_mark));
}

nlohmann::json snapshot_json(const Options &o, const journal::VerifyReport &r) {
    if (!r.snapshot_mark) return nullptr;
    return {{"taken", taken_as_snapshot(o, r)},
            {"at", format_time(r.snapshot_mark->at_us)},
            {"at_us", r.snapshot_mark->at_us},
            {"live", r.snapshot_mark->live},
            {"through_event", last_event(r)}};
}

// Why system-journal files named on the command line do not vouch for this journal, if they
// do not: they hold no head of it (a journal rewritten under a new id has none), or they hold
// heads of another journal from the same host that the auditor did not name (one deleted, and
// its history not in this one, or this one the old one rewritten once root sent it a head).
std::optional<std::string> unvouched(const Options &o, const SystemJournalPart &part) {
    const auto &others = part.others;
    if (part.check->records == 0) {
        std::string senders;
        for (auto &[uid, n] : others.untrusted_senders)
            senders += (senders.empty() ? "" : ", ") + std::to_string(n) + " from uid " +
                       quote_untrusted(uid);
        return "it holds no chain head of this journal (id " + quote_untrusted(part.journal_id) +
               ") that root or the daemon's account sent, so it vouches for none of it: a "
               "journal rewritten under a new id looks like this" +
               (senders.empty()
                    ? std::string(" (the daemon sends its head there at most once a second "
                                  "while it commits; if this node's daemon sent none, verify "
                                  "without --system-journal*)")
                    : "; it holds heads of it sent by other accounts (" + senders +
                          "): if one is the daemon's account on the node, name its uid with "
                          "--daemon-uid");
    }
    if (others.truncated)
        return "it holds heads of more than " + std::to_string(journal::max_other_journals) +
               " other journals, so it cannot tell whether one of them was on this journal's "
               "host (name fewer files: those of this host)";
    auto other = journal::other_journals_on_host(*part.copies, others.journals, o.expect_journals);
    if (other.empty()) return std::nullopt;
    const auto &r = other.front();
    return "it also holds chain heads of another journal from this journal's host (id " +
           quote_untrusted(r.journal_id) + " at " + quote_untrusted(r.journal_path) + ", " +
           std::to_string(r.records) + " record(s), through event " + std::to_string(r.newest_seq) +
           ", the latest at " + format_time(r.newest_at_us) +
           (other.size() > 1 ? "; and " + std::to_string(other.size() - 1) + " more"
                             : std::string()) +
           "): a journal deleted, whose history is not in this one, or this one rewritten under "
           "a new id looks like this (name the journals that run there with --expect-journal "
           "ID, and verify each on its own)";
}

int verify(const Options &o) {
    if (!o.export_file.empty()) return verify_export_file(o.export_file, o.allow_gaps, o.json);
    bool tty = !o.json && isatty(STDERR_FILENO);
    auto progress = [tty](std::int64_t done, std::int64_t total) {
        if (!tty || total == 0) return;
        // Straight to stdio: the CR that redraws the line is ours, and std::cerr escapes CRs.
        std::cerr << std::flush;
        std::fprintf(stderr, "\rverifying: %lld/%lld events (%lld%%)", static_cast<long long>(done),
                     static_cast<long long>(total), static_cast<long long>(done * 100 / total));
        std::fflush(stderr);
    };
    // --retention: the auditor's word on the node's retention, in microseconds (at most two
    // centuries: the sane time range the journal's values are held to).
    std::optional<std::int64_t> retention_us;
    if (!o.retention.empty()) {
        auto age = policy::parse_duration(o.retention);
        if (!age || age->count() <= 0 || age->count() > 200LL * 365 * 86400)
            return fail(o, "verify",
                        make_error(Errc::invalid_argument, "--retention: cannot read the age " +
                                                               quote_untrusted(o.retention) +
                                                               " (e.g. 180d, 36h, 3600)"));
        retention_us = std::chrono::duration_cast<std::chrono::microseconds>(*age).count();
    }
    // One connection for all of it (a copy with a -wal but no -shm is copied once, not per
    // check), and the copies compared with the very snapshot the chain walk verified.
    auto opened = journal::ReadOnlyJournal::open(o.db);
    if (!opened) return fail(o, "verify", opened.error());
    auto system = read_system_journal(o, opened->db());
    if (!system) return fail(o, "verify", system.error());
    auto report = journal::verify_chain(*opened, o.db, progress, o.anchor,
                                        o.no_anchor             ? journal::AnchorUse::ignore
                                        : o.allow_pruned_anchor ? journal::AnchorUse::allow_pruned
                                                                : journal::AnchorUse::require,
                                        retention_us);
    if (tty) std::cerr << "\n";
    if (!report) return fail(o, "verify", report.error());
    if (system->copies) {
        auto check = journal::check_anchor_copies(
            opened->db(), o.db, *system->copies, o.allow_pruned_anchor, retention_us,
            taken_as_snapshot(o, *report) ? std::optional(report->snapshot_mark->at_us)
                                          : std::nullopt,
            report->prunes);
        if (!check) return fail(o, "verify", check.error());
        system->check = std::move(*check);
        if (system->required && system->check->ok)
            if (auto why = unvouched(o, *system)) {
                system->check->ok = false;
                system->check->problem = *why;
            }
    }
    const auto &sys = system->check;
    bool ok = report->ok && (!sys || sys->ok);
    nlohmann::json sys_json{{"checked", sys.has_value()}, {"source", system->source}};
    if (sys) {
        sys_json["ok"] = sys->ok;
        sys_json["records"] = sys->records;
        sys_json["compared"] = sys->compared;
        sys_json["pruned"] = sys->pruned;
        sys_json["pruned_by_retention"] = sys->pruned_by_retention;
        sys_json["newest_seq"] = sys->newest ? nlohmann::json(sys->newest->seq) : nlohmann::json();
        sys_json["newest_at"] =
            sys->newest ? nlohmann::json(format_time(sys->newest->at_us)) : nlohmann::json();
        sys_json["first_bad_event"] = sys->bad_seq;
        sys_json["problem"] = sys->problem;
        sys_json["newer_than_snapshot"] = sys->newer_than_snapshot;
        sys_json["last_event"] = sys->last_event;
        sys_json["head_runs"] = sys->runs;
        sys_json["missing_heads"] = sys->missing_heads;
        nlohmann::json gaps = nlohmann::json::array();
        for (auto &m : sys->missing)
            gaps.push_back({{"run", m.run},
                            {"first", m.first},
                            {"last", m.last},
                            {"after_event", m.after_seq},
                            {"before_event", m.before_seq},
                            {"tail", m.tail}});
        sys_json["missing"] = gaps;
    } else {
        sys_json["note"] = system->note;
    }
    if (o.json) {
        std::cout << knod::dump_json_escaped(
                         nlohmann::json{
                             {"ok", ok},
                             // For --expect-journal on another journal's verify.
                             {"journal_id", system->journal_id.empty()
                                                ? nlohmann::json()
                                                : nlohmann::json(system->journal_id)},
                             {"events_checked", report->events_checked},
                             {"total_events", report->total_events},
                             {"first_seq", report->first_seq},
                             {"first_bad_event", report->first_bad_seq},
                             {"problem", report->problem},
                             {"head_hash", report->head_hash},
                             {"anchor_checked", report->anchor_checked},
                             {"anchor_seq", report->anchor_seq},
                             {"anchor_pruned", report->anchor_pruned},
                             {"anchor_pruned_by_retention", report->anchor_pruned_by_retention},
                             {"retention_us",
                              retention_us ? nlohmann::json(*retention_us) : nlohmann::json()},
                             {"sessions_checked", report->sessions_checked},
                             {"sessions_not_covered", report->sessions_not_covered},
                             {"policies_checked", report->policies_checked},
                             {"chain_intact", report->chain_intact},
                             {"snapshot", snapshot_json(o, *report)},
                             {"system_journal", sys_json}},
                         2)
                  << "\n";
        return ok ? exit_ok : exit_failed;
    }
    if (report->ok) {
        std::cout << "ok: " << report->events_checked << " event(s) chain correctly";
        if (report->first_seq > 1)
            std::cout << " from event " << report->first_seq
                      << " (earlier ones pruned at a checkpoint)";
        std::cout << "; head " << report->head_hash << "\n"
                  << (report->anchor_checked
                          ? "anchor: event " + std::to_string(report->anchor_seq) +
                                " matches the head kept outside the database\n"
                      : o.no_anchor ? "anchor: not checked (--no-anchor): a truncated tail "
                                      "would not be found\n"
                      : report->anchor_pruned_by_retention
                          ? "anchor: event " + std::to_string(report->anchor_seq) +
                                " was pruned by a prune that keeps --retention " + o.retention +
                                " (accepted); the chain head is not compared\n"
                          : "anchor: event " + std::to_string(report->anchor_seq) +
                                " was pruned (accepted: --allow-pruned-anchor); the "
                                "chain head is not compared\n");
        print_tables(*report);
        if (taken_as_snapshot(o, *report))
            std::cout << "snapshot: a copy of " << quote_untrusted(report->snapshot_mark->live)
                      << " the daemon published at " << format_time(report->snapshot_mark->at_us)
                      << ", through event " << last_event(*report)
                      << "; what it journaled after that is not in it (root verifies the live "
                         "journal for that)\n";
        else if (report->snapshot_mark)
            std::cout << "snapshot: the anchor says this is a snapshot of "
                      << quote_untrusted(report->snapshot_mark->live)
                      << ", but it is not where the daemon publishes one (that journal's "
                         "snapshot/): read as a whole journal (--as-snapshot for a snapshot "
                         "copied elsewhere)\n";
    } else if (report->chain_intact) { // a table beside the chain contradicts it
        std::cout << "FAILED: "
                  << (report->first_bad_seq
                          ? "first bad event " + std::to_string(report->first_bad_seq) + ": "
                          : std::string())
                  << report->problem << "\n"
                  << "the chain itself is intact (" << report->events_checked << " event(s))\n";
    } else if (report->first_bad_seq == 0) { // a table changed: the chain was not walked
        std::cout << "FAILED: " << report->problem << "\n";
    } else {
        std::cout << "FAILED: first bad event " << report->first_bad_seq << ": " << report->problem
                  << "\n"
                  << report->events_checked << " event(s) before it chain correctly\n";
    }
    if (!sys) {
        std::cout << "system journal: " << system->note
                  << (o.no_system_journal ? ""
                                          : " (a rollback of the database with its anchor "
                                            "would not be found)")
                  << "\n";
    } else if (sys->ok) {
        std::cout << "system journal: " << sys->compared << " chain-head record(s) in "
                  << system->source << " match";
        if (sys->pruned) std::cout << ", " << sys->pruned << " name pruned events";
        if (sys->pruned_by_retention)
            std::cout << " (" << sys->pruned_by_retention << " recorded at least --retention "
                      << o.retention << " ago: old enough to have been pruned)";
        if (sys->newest)
            std::cout << "; newest: event " << sys->newest->seq << " of " << sys->last_event
                      << " at " << format_time(sys->newest->at_us);
        else
            std::cout << " (none found for this journal)";
        if (sys->newer_than_snapshot)
            std::cout << "; " << sys->newer_than_snapshot
                      << " came after the snapshot was taken (in the live journal, not here)";
        std::cout << "\n";
    } else {
        std::cout << "FAILED: system journal: " << sys->problem << "\n"
                  << "system journal: " << sys->records << " chain-head record(s) of this journal "
                  << "read from " << system->source << ", " << sys->compared << " match\n";
        for (auto &m : sys->missing)
            std::cout << "system journal: missing head(s) " << m.first << ".." << m.last
                      << " of daemon run " << m.run
                      << (m.tail ? ", after the head of event " : ", between the heads of events ")
                      << m.after_seq << (m.tail ? "; its daemon-stop is event " : " and ")
                      << m.before_seq << "\n";
    }
    return ok ? exit_ok : exit_failed;
}

} // namespace

Runner add_audit(CLI::App &app) {
    auto o = std::make_shared<Options>();
    auto *audit =
        app.add_subcommand("audit", "Read the session journal: sessions, events, reports, "
                                    "exports, and chain verification. Read-only.");
    audit->require_subcommand(1);
    auto *sessions = audit->add_subcommand("sessions", "List sessions (bindings), oldest first.");
    auto *events = audit->add_subcommand("events", "List journal events, in chain order.");
    auto *show_cmd =
        audit->add_subcommand("show", "One session with every event that mentions it.");
    auto *report_cmd = audit->add_subcommand(
        "report", "Per user, netdev, GPU, pod namespace and hour over a period: sessions, bytes, "
                  "denials, quota "
                  "refusals, other refusals, revocations; and the rules behind the refusals.");
    auto *export_cmd = audit->add_subcommand(
        "export", "Stream events or sessions as JSON lines or CSV, for a SIEM or an archive.");
    auto *verify_cmd = audit->add_subcommand(
        "verify", "Check the journal's hash chain and its anchor: finds any edited, deleted, "
                  "inserted or reordered event, and a truncated tail; then every sessions row, "
                  "stored policy text, meta.journal_id and checkpoint against the events that "
                  "vouch for them.");
    for (auto *c : {sessions, events, show_cmd, report_cmd, export_cmd, verify_cmd})
        add_db(c, *o);
    add_filters(sessions, *o, false);
    add_output(sessions, *o);
    add_filters(events, *o, true);
    add_output(events, *o);
    show_cmd->add_option("SESSION", o->session, "session (binding) id")->required();
    show_cmd->add_flag("--json", o->json, "print JSON");
    report_cmd->add_option("--since", o->since, "from this time (date or age like 7d)");
    report_cmd->add_option("--until", o->until, "before this time");
    report_cmd->add_option("--uid,--user", o->user, "one user (the session's owner), uid or name");
    report_cmd->add_option("--netdev", o->netdev, "one network device");
    report_cmd->add_option("--gpu", o->gpu, "one GPU");
    report_cmd->add_flag("--json", o->json, "print JSON (shape below)");
    report_cmd
        ->add_option("--html", o->html,
                     "write the report as one self-contained HTML page (charts, tables) to FILE "
                     "('-': stdout); with --json the JSON is printed too")
        ->type_name("FILE");
    report_cmd->footer(std::string(report_help) +
                       "\nExit codes: 0 ok; 2 bad usage, an unreadable journal or an "
                       "unwritable --html file.");
    add_filters(export_cmd, *o, true);
    export_cmd->add_option("--format", o->format, "jsonl or csv")
        ->check(CLI::IsMember({"jsonl", "csv"}))
        ->capture_default_str();
    export_cmd->add_option("--table", o->table, "events or sessions")
        ->check(CLI::IsMember({"events", "sessions"}))
        ->capture_default_str();
    export_cmd->footer(
        "Each event record has event_id (JOURNAL_ID-SEQ, unique across journals and hosts), "
        "time (RFC 3339, microseconds, UTC) and at_us, host and machine_id, netdev, gpu and "
        "flows, the hashed fields, prev_hash and hash (docs/audit-export.md). A JSON-lines "
        "export of events can be re-verified without the database (audit verify --export "
        "FILE); a CSV export cannot. For an incremental export pass the last event_id exported "
        "as --after.\nExit codes: 0 ok; 2 bad usage, an unreadable journal, or an --after "
        "from another journal.");
    verify_cmd->add_option("--anchor", o->anchor,
                           "the chain head kept outside the database (default: DB.anchor; missing "
                           "is a failure unless --no-anchor)");
    auto *no_anchor = verify_cmd->add_flag(
        "--no-anchor", o->no_anchor,
        "check the chain alone, for a copy taken without its anchor (a truncated tail then "
        "goes unnoticed)");
    no_anchor->excludes(verify_cmd->get_option("--anchor"));
    verify_cmd->add_flag(
        "--allow-pruned-anchor", o->allow_pruned_anchor,
        "accept an anchor or system-journal record naming an event retention pruned since (a "
        "checkpoint at its seq must still hold its hash); without it that is a failure, since "
        "heads are public and wiping all history and chaining a new one looks the same");
    verify_cmd->add_option(
        "--expect-journal", o->expect_journals,
        "another journal id the named system-journal files may hold heads of from this "
        "journal's host (another daemon there, or a journal deleted on purpose); any other "
        "fails, since a journal rewritten under a new id looks the same (repeatable)");
    verify_cmd
        ->add_option("--daemon-uid", o->daemon_uid,
                     "the daemon's uid on the node, when this machine's knod-policy "
                     "account has another (or none): heads it sent count beside root's")
        ->check(CLI::Number);
    auto *retention = verify_cmd->add_option(
        "--retention", o->retention,
        "the node's retention (e.g. 180d): every retention-prune must have removed only "
        "events at least this old (a prune that records no times fails), and an anchor or "
        "system-journal record of a pruned event is accepted when a prune in the chain removed "
        "it and the copy is at least this old by this machine's clock (journald's time; the "
        "anchor file's mtime: copy it with cp -p)");
    retention->type_name("AGE")->excludes(verify_cmd->get_option("--allow-pruned-anchor"));
    verify_cmd->add_flag(
        "--as-snapshot", o->as_snapshot,
        "the file is a snapshot the daemon published, copied elsewhere: take its anchor's word on "
        "when it was taken, so chain heads the system journal received after that are newer "
        "than the copy, not a lost tail (where the daemon publishes it, STATE_DIR/snapshot/, "
        "this is the default; a mark on any other file is only a claim)");
    auto *sys_on = verify_cmd->add_flag(
        "--system-journal", o->system_journal,
        "compare the chain-head records the daemon sent to the system journal (default: where "
        "it can be read; with this flag an unreadable system journal is exit 2)");
    auto *sys_off = verify_cmd->add_flag("--no-system-journal", o->no_system_journal,
                                         "do not read the system journal");
    auto *sys_dir = verify_cmd->add_option(
        "--system-journal-dir", o->system_journal_dir,
        "read the chain-head records from the journal files in DIR (gathered from the host)");
    auto *sys_files =
        verify_cmd->add_option("--system-journal-file", o->system_journal_files,
                               "read the chain-head records from this journal file (repeatable)");
    for (auto *opt : {sys_on, sys_dir, sys_files})
        sys_off->excludes(opt);
    sys_dir->excludes(sys_files);
    verify_cmd->add_flag("--json", o->json, "print the result as JSON");
    auto *export_file = verify_cmd->add_option(
        "--export", o->export_file,
        "check a JSON-lines export (audit export --format jsonl) instead of a journal, without "
        "the database: each line's hash from its own fields, and each line chaining to the one "
        "before; '-' reads stdin. A CSV export cannot be verified");
    export_file->excludes(verify_cmd->get_option("--anchor"))
        ->excludes(no_anchor)
        ->excludes(retention)
        ->excludes(verify_cmd->get_option("--db"));
    verify_cmd
        ->add_flag("--allow-gaps", o->allow_gaps,
                   "with --export: accept missing events between lines (an export made "
                   "with filters); each line is still checked against its hash")
        ->needs(export_file);
    verify_cmd->footer(
        "Exit codes: 0 when the chain is intact, 1 naming the first bad event (or a missing "
        "anchor, or "
        "a chain-head record in the system journal that the database no longer matches, or a "
        "retention-prune younger than the retention it records or than --retention), 2 "
        "when the journal, the anchor or a system journal asked for cannot be read (with the "
        "reason; --json prints {\"error\": ...}). With --export: 1 names the first edited, "
        "reordered or replaced "
        "line (file line number and event id) or the gaps; 2 for a file that cannot be read or "
        "is not an export. What an export's verification proves is in docs/audit-export.md.");
    auto policy_cmd = add_audit_policy(*audit);
    audit->footer("Times are UTC. Exit codes: 0 ok, 1 verification failed (tampered), 2 bad "
                  "input or an unreadable journal, with the reason.");

    return [=]() -> int {
        if (o->export_file.empty()) read_snapshot_if_live_unreadable(o->db);
        if (sessions->parsed()) return list_sessions(*o);
        if (events->parsed()) return list_events(*o);
        if (show_cmd->parsed()) return show(*o);
        if (report_cmd->parsed()) return report(*o);
        if (export_cmd->parsed()) return export_rows(*o);
        if (verify_cmd->parsed()) return verify(*o);
        return policy_cmd();
    };
}

} // namespace knod::cli
