// knod-policy audit: what security teams ask of the session journal, on a live host or on a
// copy gathered from another node. Everything here opens the journal read-only.
#include "cli/audit_format.h"
#include "cli/commands.h"
#include "daemon/journal/reader.h"
#include "daemon/journal/system_journal.h"
#include "daemon/journal/verify.h"
#include "knod/json.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdio>
#include <iomanip>
#include <iostream>

namespace knod::cli {
namespace {

constexpr const char *default_db = "/var/lib/knod-policy/journal.db";

struct Options {
    std::string db = default_db;
    bool json = false, csv = false;
    std::string since, until, user, netdev, gpu, rule, decision, reason, kind;
    std::int64_t limit = 0;
    std::string session;
    std::string format = "jsonl";
    std::string table = "events";
    std::string anchor;
    bool no_anchor = false;
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

void add_filters(CLI::App *cmd, Options &o, bool events) {
    cmd->add_option("--since", o.since,
                    "from this time: 2026-11-29, 2026-11-29T10:00Z, or an age like 24h, 7d");
    cmd->add_option("--until", o.until, "before this time (same forms)");
    cmd->add_option("--uid,--user", o.user, "one user, by uid or name");
    cmd->add_option("--netdev", o.netdev, "one network device");
    cmd->add_option("--gpu", o.gpu, "one GPU");
    cmd->add_option("--rule", o.rule, "the deciding policy rule");
    cmd->add_option("--reason", o.reason, events ? "the event's reason" : "why the session ended");
    if (events) {
        cmd->add_option("--decision", o.decision, "allow, deny, quota-exceeded, would-deny, ...");
        cmd->add_option("--kind", o.kind,
                        "request-granted, request-denied, session-ended, revoke, ...");
    }
    cmd->add_option("--limit", o.limit, "at most this many rows");
}

void add_output(CLI::App *cmd, Options &o) {
    auto *j = cmd->add_flag("--json", o.json, "a JSON array");
    auto *c = cmd->add_flag("--csv", o.csv, "CSV with a header row");
    j->excludes(c);
}

Result<journal::Filter> make_filter(const Options &o) {
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
            f.uid = std::stoll(o.user);
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
    return f;
}

// Anything that stops a command before it has an answer (bad input, a journal that cannot be
// read) is exit 2 with the reason; exit 1 is kept for "the journal was tampered with". With
// --json the reason is also a JSON object on stdout, so a script never parses nothing.
int fail(const Options &o, const std::string &what, const Error &e) {
    std::cerr << "knod-policy audit " << what << ": " << e.message << "\n";
    if (o.json)
        std::cout << knod::dump_json(nlohmann::json{{"error", e.message}, {"command", what}})
                  << "\n";
    return exit_usage;
}

// Prints rows as a table, a JSON array or CSV, as they stream in.
class Printer {
  public:
    Printer(const Options &o, std::vector<std::string> columns, std::vector<std::size_t> shown)
        : o_(o), columns_(std::move(columns)), shown_(std::move(shown)) {
        if (o_.csv) std::cout << csv_row(columns_) << "\n";
        if (!o_.csv && !o_.json) row(columns_, true);
    }
    void add(const nlohmann::json &j, const std::vector<std::string> &fields) {
        ++count_;
        if (o_.json)
            std::cout << (count_ > 1 ? ",\n" : "[\n") << knod::dump_json(j);
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
                      << knod::dump_json(nlohmann::json{{"error", e.message}, {"command", what}})
                      << "\n]\n";
            return exit_usage;
        }
        return fail(o_, what, e);
    }

  private:
    void row(const std::vector<std::string> &fields, bool header) {
        for (std::size_t i : shown_) {
            std::string v = fields[i];
            if (header) std::transform(v.begin(), v.end(), v.begin(), ::toupper);
            std::cout << std::left << std::setw(i == shown_.back() ? 0 : 21) << v << " ";
        }
        std::cout << "\n";
    }
    const Options &o_;
    std::vector<std::string> columns_;
    std::vector<std::size_t> shown_;
    std::size_t count_ = 0;
};

int list_sessions(const Options &o) {
    auto f = make_filter(o);
    if (!f) return fail(o, "sessions", f.error());
    auto r = journal::JournalReader::open(o.db);
    if (!r) return fail(o, "sessions", r.error());
    Printer p(o, session_columns, {0, 1, 3, 4, 6, 7, 8, 9, 11});
    auto done = r->sessions(*f, [&](const journal::Session &s) {
        p.add(session_json(s), session_row(s));
        return true;
    });
    if (!done) return p.abort("sessions", done.error());
    p.finish("session(s)");
    return exit_ok;
}

int list_events(const Options &o) {
    auto f = make_filter(o);
    if (!f) return fail(o, "events", f.error());
    auto r = journal::JournalReader::open(o.db);
    if (!r) return fail(o, "events", r.error());
    Printer p(o, event_columns, {0, 1, 2, 3, 4, 6, 7, 8});
    auto done = r->events(*f, [&](const journal::StoredEvent &e) {
        p.add(event_json(e), event_row(e));
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
    std::vector<journal::StoredEvent> events;
    auto done = r->events(f, [&](const journal::StoredEvent &e) {
        if (e.event.session_id == o.session) events.push_back(e);
        return true;
    });
    if (!done) return fail(o, "show", done.error());
    if (o.json) {
        nlohmann::json j = session_json(**s);
        j["events"] = nlohmann::json::array();
        for (auto &e : events)
            j["events"].push_back(event_json(e));
        std::cout << knod::dump_json(j, 2) << "\n";
        return exit_ok;
    }
    auto row = session_row(**s);
    for (std::size_t i = 0; i < session_columns.size(); ++i)
        std::cout << std::left << std::setw(16) << session_columns[i] + ":" << row[i] << "\n";
    std::cout << "events:\n";
    for (auto &e : events)
        std::cout << "  " << e.seq << "  " << format_time(e.event.at_us) << "  " << e.event.kind
                  << (e.event.reason ? "  (" + *e.event.reason + ")" : "") << "\n";
    return exit_ok;
}

int report(const Options &o) {
    auto f = make_filter(o);
    if (!f) return fail(o, "report", f.error());
    auto r = journal::JournalReader::open(o.db);
    if (!r) return fail(o, "report", r.error());
    auto rep = r->report(*f);
    if (!rep) return fail(o, "report", rep.error());
    auto tallies = [](const std::vector<journal::Tally> &ts) {
        nlohmann::json a = nlohmann::json::array();
        for (auto &t : ts)
            a.push_back({{"key", t.key},
                         {"sessions", t.sessions},
                         {"rx_bytes", t.rx_bytes},
                         {"denials", t.denials},
                         {"revocations", t.revocations}});
        return a;
    };
    nlohmann::json top = nlohmann::json::array();
    for (auto &[rule, n] : rep->top_denied_rules)
        top.push_back({{"rule", rule}, {"denials", n}});
    if (o.json) {
        std::cout << knod::dump_json(
                         nlohmann::json{
                             {"since", o.since.empty() ? nlohmann::json()
                                                       : nlohmann::json(format_time(f->since_us))},
                             {"until", o.until.empty() ? nlohmann::json()
                                                       : nlohmann::json(format_time(f->until_us))},
                             {"by_user", tallies(rep->by_user)},
                             {"by_netdev", tallies(rep->by_netdev)},
                             {"top_denied_rules", top}},
                         2)
                  << "\n";
        return exit_ok;
    }
    auto print = [](const char *title, const char *key, const std::vector<journal::Tally> &ts) {
        std::cout << title << "\n  " << std::left << std::setw(12) << key << std::setw(10)
                  << "SESSIONS" << std::setw(14) << "RX_BYTES" << std::setw(9) << "DENIALS"
                  << "REVOCATIONS\n";
        for (auto &t : ts)
            std::cout << "  " << std::setw(12) << t.key << std::setw(10) << t.sessions
                      << std::setw(14) << t.rx_bytes << std::setw(9) << t.denials << t.revocations
                      << "\n";
    };
    print("per user", "UID", rep->by_user);
    print("per netdev", "NETDEV", rep->by_netdev);
    std::cout << "top denied rules\n";
    for (auto &[rule, n] : rep->top_denied_rules)
        std::cout << "  " << std::setw(24) << rule << n << "\n";
    return exit_ok;
}

int export_rows(const Options &o) {
    auto f = make_filter(o);
    if (!f) return fail(o, "export", f.error());
    auto r = journal::JournalReader::open(o.db);
    if (!r) return fail(o, "export", r.error());
    bool csv = o.format == "csv";
    std::size_t n = 0;
    Result<void> done;
    if (o.table == "sessions") {
        if (csv) std::cout << csv_row(session_columns) << "\n";
        done = r->sessions(*f, [&](const journal::Session &s) {
            std::cout << (csv ? csv_row(session_row(s)) : knod::dump_json(session_json(s))) << "\n";
            ++n;
            return true;
        });
    } else {
        if (csv) std::cout << csv_row(event_columns) << "\n";
        done = r->events(*f, [&](const journal::StoredEvent &e) {
            std::cout << (csv ? csv_row(event_row(e)) : knod::dump_json(event_json(e))) << "\n";
            ++n;
            return true;
        });
    }
    if (!done) return fail(o, "export", done.error());
    std::cerr << "exported " << n << " " << o.table << "\n";
    return exit_ok;
}

// The system journal's part of verify: nullopt when it was not read (skipped, or unreadable
// and not asked for by name: `note` says why); an error when asked for by name and unreadable.
struct SystemJournalPart {
    std::optional<journal::SystemJournalCheck> check;
    std::string source;
    std::string note;
};

Result<SystemJournalPart> check_system_journal(const Options &o) {
    SystemJournalPart part;
    journal::SystemJournalSource source{o.system_journal_dir, o.system_journal_files};
    part.source = source.describe();
    bool required = o.system_journal || !source.local();
    if (o.no_system_journal) {
        part.note = "not checked (--no-system-journal)";
        return part;
    }
    auto unread = [&](const Error &e) -> Result<SystemJournalPart> {
        if (required) return e;
        part.note = "not checked: " + e.message;
        return part;
    };
    // The id first, the copies next, the database's snapshot last: the daemon sends a head only
    // after committing it, so no copy read here can be ahead of an intact database.
    auto reader = journal::JournalReader::open(o.db);
    if (!reader) return reader.error();
    auto id = reader->identity();
    if (!id) return id.error();
    if (id->journal_id.empty())
        return unread(make_error(Errc::unsupported,
                                 "the journal has no id (written before schema 4), so its "
                                 "copies in the system journal cannot be told apart"));
    auto copies = journal::read_anchor_copies(source, id->journal_id);
    if (!copies) return unread(copies.error());
    auto check = journal::check_anchor_copies(o.db, *copies);
    if (!check) return check.error();
    part.check = *check;
    return part;
}

int verify(const Options &o) {
    bool tty = !o.json && isatty(STDERR_FILENO);
    auto progress = [tty](std::int64_t done, std::int64_t total) {
        if (!tty || total == 0) return;
        // Straight to stdio: the CR that redraws the line is ours, and std::cerr escapes CRs.
        std::cerr << std::flush;
        std::fprintf(stderr, "\rverifying: %lld/%lld events (%lld%%)", static_cast<long long>(done),
                     static_cast<long long>(total), static_cast<long long>(done * 100 / total));
        std::fflush(stderr);
    };
    auto system = check_system_journal(o);
    if (!system) return fail(o, "verify", system.error());
    auto report = journal::verify_chain(o.db, progress, o.anchor,
                                        o.no_anchor ? journal::AnchorUse::ignore
                                                    : journal::AnchorUse::require);
    if (tty) std::cerr << "\n";
    if (!report) return fail(o, "verify", report.error());
    const auto &sys = system->check;
    bool ok = report->ok && (!sys || sys->ok);
    nlohmann::json sys_json{{"checked", sys.has_value()}, {"source", system->source}};
    if (sys) {
        sys_json["ok"] = sys->ok;
        sys_json["records"] = sys->records;
        sys_json["compared"] = sys->compared;
        sys_json["pruned"] = sys->pruned;
        sys_json["newest_seq"] = sys->newest ? nlohmann::json(sys->newest->seq) : nlohmann::json();
        sys_json["newest_at"] =
            sys->newest ? nlohmann::json(format_time(sys->newest->at_us)) : nlohmann::json();
        sys_json["first_bad_event"] = sys->bad_seq;
        sys_json["problem"] = sys->problem;
    } else {
        sys_json["note"] = system->note;
    }
    if (o.json) {
        std::cout << knod::dump_json(nlohmann::json{{"ok", ok},
                                                    {"events_checked", report->events_checked},
                                                    {"total_events", report->total_events},
                                                    {"first_seq", report->first_seq},
                                                    {"first_bad_event", report->first_bad_seq},
                                                    {"problem", report->problem},
                                                    {"head_hash", report->head_hash},
                                                    {"anchor_checked", report->anchor_checked},
                                                    {"anchor_seq", report->anchor_seq},
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
                                    : "anchor: event " + std::to_string(report->anchor_seq) +
                                          " was pruned; the chain head is not compared\n");
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
        if (sys->newest)
            std::cout << "; newest: event " << sys->newest->seq << " at "
                      << format_time(sys->newest->at_us);
        else
            std::cout << " (none found for this journal)";
        std::cout << "\n";
    } else {
        std::cout << "FAILED: system journal: " << sys->problem << "\n"
                  << "system journal: " << sys->records << " chain-head record(s) of this journal "
                  << "read from " << system->source << ", " << sys->compared << " match\n";
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
        "report", "Per user and per netdev over a period: sessions, bytes, denials, revocations; "
                  "and the rules that denied most.");
    auto *export_cmd =
        audit->add_subcommand("export", "Stream events or sessions as JSON lines or CSV.");
    auto *verify_cmd = audit->add_subcommand(
        "verify", "Check the journal's hash chain and its anchor: finds any edited, deleted, "
                  "inserted or reordered event, and a truncated tail.");
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
    report_cmd->add_flag("--json", o->json, "print JSON");
    add_filters(export_cmd, *o, true);
    export_cmd->add_option("--format", o->format, "jsonl or csv")
        ->check(CLI::IsMember({"jsonl", "csv"}))
        ->capture_default_str();
    export_cmd->add_option("--table", o->table, "events or sessions")
        ->check(CLI::IsMember({"events", "sessions"}))
        ->capture_default_str();
    verify_cmd->add_option("--anchor", o->anchor,
                           "the chain head kept outside the database (default: DB.anchor; missing "
                           "is a failure unless --no-anchor)");
    auto *no_anchor = verify_cmd->add_flag(
        "--no-anchor", o->no_anchor,
        "check the chain alone, for a copy taken without its anchor (a truncated tail then "
        "goes unnoticed)");
    no_anchor->excludes(verify_cmd->get_option("--anchor"));
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
    verify_cmd->footer(
        "Exit 0 when the chain is intact, 1 naming the first bad event (or a missing anchor, or "
        "a chain-head record in the system journal that the database no longer matches), 2 "
        "when the journal, the anchor or a system journal asked for cannot be read (with the "
        "reason; --json prints {\"error\": ...}).");
    audit->footer("Times are UTC. Exit codes: 0 ok, 1 verification failed (tampered), 2 bad "
                  "input or an unreadable journal, with the reason.");

    return [=]() -> int {
        if (sessions->parsed()) return list_sessions(*o);
        if (events->parsed()) return list_events(*o);
        if (show_cmd->parsed()) return show(*o);
        if (report_cmd->parsed()) return report(*o);
        if (export_cmd->parsed()) return export_rows(*o);
        if (verify_cmd->parsed()) return verify(*o);
        return -1;
    };
}

} // namespace knod::cli
