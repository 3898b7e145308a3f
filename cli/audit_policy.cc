// knod-policy audit policy: the policies the daemon ran with, as the journal keeps them (once per
// SHA-256 digest; every policy load and decision event names the digest in its detail).
#include "cli/audit_format.h"
#include "cli/commands.h"
#include "journal/reader.h"
#include "knod/json.h"
#include "knod/untrusted.h"

#include <iomanip>
#include <iostream>
#include <map>

namespace knod::cli {
namespace {

struct PolicyOptions {
    std::string db = "/var/lib/knod-policy/journal.db";
    std::string digest;
    bool json = false;
};

struct Stored {
    std::string digest;
    std::int64_t first_loaded_us = 0;
    std::string text;
};

Result<bool> has_policies(journal::Database &db) {
    auto n = db.scalar("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = "
                       "'policies'");
    if (!n) return n.error();
    return *n > 0;
}

// The stored policy whose digest is `digest` or starts with it (at least 8 hex digits, one
// match), as `git` takes a short hash.
Result<Stored> find(journal::Database &db, const std::string &digest) {
    if (digest.size() < 8 || digest.size() > 64 ||
        digest.find_first_not_of("0123456789abcdef") != std::string::npos)
        return make_error(Errc::invalid_argument,
                          "DIGEST: 8 to 64 lowercase hex digits (a SHA-256 or its start), not " +
                              quote_untrusted(digest));
    auto st = db.prepare("SELECT digest, first_loaded_us, text FROM policies WHERE "
                         "substr(digest, 1, ?) = ? LIMIT 2");
    if (!st) return st.error();
    st->bind(1, static_cast<std::int64_t>(digest.size())).bind(2, digest);
    std::vector<Stored> found;
    for (;;) {
        auto row = st->step();
        if (!row) return row.error();
        if (!*row) break;
        found.push_back({st->text(0), st->int64(1), st->text(2)});
    }
    if (found.empty())
        return make_error(Errc::not_found, "no policy with digest " + digest + " in the journal");
    if (found.size() > 1)
        return make_error(Errc::invalid_argument,
                          "digest " + digest + " is ambiguous: give more of it");
    return found.front();
}

// How many events name each digest ("policy" in their detail).
Result<std::map<std::string, std::int64_t>> naming_counts(journal::Database &db) {
    std::map<std::string, std::int64_t> out;
    auto st = db.prepare("SELECT json_extract(detail, '$.policy') AS d, count(*) FROM events "
                         "WHERE detail LIKE '%\"policy\"%' AND json_valid(detail) AND "
                         "json_type(detail, '$.policy') = 'text' GROUP BY d");
    if (!st) return st.error();
    for (;;) {
        auto row = st->step();
        if (!row) return row.error();
        if (!*row) return out;
        out[st->text(0)] = st->int64(1);
    }
}

int run(const PolicyOptions &o) {
    auto fail = [&](const Error &e) {
        std::cerr << "knod-policy audit policy: " << e.message << "\n";
        if (o.json)
            std::cout << knod::dump_json_escaped(
                             nlohmann::json{{"error", e.message}, {"command", "policy"}})
                      << "\n";
        return exit_usage;
    };
    auto j = journal::ReadOnlyJournal::open(o.db);
    if (!j) return fail(j.error());
    auto &db = j->db();
    auto has = has_policies(db);
    if (!has) return fail(has.error());
    if (!*has)
        return fail(make_error(Errc::not_found, o.db + ": this journal predates stored policies "
                                                       "(schema 4); no policy text is kept"));
    if (!o.digest.empty()) {
        auto p = find(db, o.digest);
        if (!p) return fail(p.error());
        if (o.json) {
            std::cout << knod::dump_json_escaped(
                             nlohmann::json{{"digest", p->digest},
                                            {"first_loaded", format_time(p->first_loaded_us)},
                                            {"text", p->text}},
                             2)
                      << "\n";
        } else {
            // The text as loaded; control characters escaped, lines and tabs kept.
            std::cout << escape_untrusted(p->text, Escape::message);
            if (!p->text.empty() && p->text.back() != '\n') std::cout << "\n";
        }
        return exit_ok;
    }
    auto counts = naming_counts(db);
    if (!counts) return fail(counts.error());
    auto st = db.prepare("SELECT digest, first_loaded_us FROM policies ORDER BY first_loaded_us");
    if (!st) return fail(st.error());
    nlohmann::json all = nlohmann::json::array();
    if (!o.json)
        std::cout << std::left << std::setw(66) << "DIGEST" << std::setw(22) << "FIRST_LOADED"
                  << "EVENTS\n";
    for (;;) {
        auto row = st->step();
        if (!row) return fail(row.error());
        if (!*row) break;
        std::string digest = st->text(0);
        auto n = counts->count(digest) ? counts->at(digest) : 0;
        if (o.json)
            all.push_back(
                {{"digest", digest}, {"first_loaded", format_time(st->int64(1))}, {"events", n}});
        else
            std::cout << std::setw(66) << escape_untrusted(digest) << std::setw(22)
                      << format_time(st->int64(1)) << n << "\n";
    }
    if (o.json) std::cout << knod::dump_json_escaped(all, 2) << "\n";
    return exit_ok;
}

} // namespace

Runner add_audit_policy(CLI::App &audit) {
    auto o = std::make_shared<PolicyOptions>();
    auto *cmd = audit.add_subcommand(
        "policy", "The policies the daemon ran with: with DIGEST, the text of that policy (each "
                  "policy load and each decision event names its digest as detail.policy); "
                  "without, every stored policy, when it was first loaded, and how many events "
                  "name it.");
    cmd->add_option("DIGEST", o->digest, "a policy's SHA-256 (or its first 8+ hex digits)");
    cmd->add_option("--db", o->db, "journal database file; a copy works too (nothing is written)")
        ->capture_default_str();
    cmd->add_flag("--json", o->json,
                  "with DIGEST: {digest, first_loaded, text}; without: an array of {digest, "
                  "first_loaded, events}");
    cmd->footer("The text is what the daemon read, in its canonical form: for each file in load "
                "order, \"# file: PATH\" on a line of its own, then the file. `audit verify` "
                "checks each stored text against its digest.\nExit codes: 0 ok; 2 an unknown "
                "digest, bad usage or an unreadable journal.");
    return [cmd, o]() -> int {
        if (!cmd->parsed()) return -1;
        read_snapshot_if_live_unreadable(o->db);
        return run(*o);
    };
}

} // namespace knod::cli
