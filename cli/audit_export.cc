#include "cli/audit_export.h"

#include "cli/commands.h"
#include "journal/export.h"
#include "knod/json.h"
#include "knod/untrusted.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>

namespace knod::cli {

Result<journal::JournalIdentity>
record_identity(journal::JournalReader &reader, const std::string &db, const std::string &command) {
    auto id = reader.identity();
    if (!id) return std::move(id).error().context("the journal's identity");
    if (id->journal_id.empty())
        std::cerr << "knod-policy audit " << command << ": " << db
                  << " has no journal id (written before journal schema 4): event_id is the "
                     "bare sequence number, unique only within this journal, and host and "
                     "machine_id are null. The current knod-policyd gives the journal an id when "
                     "it next opens it; export again from then on for ids unique everywhere.\n";
    return id;
}

Result<std::int64_t> resume_after(const std::string &text, const journal::JournalIdentity &id,
                                  const std::string &db) {
    auto parsed = journal::parse_event_id(text);
    if (!parsed)
        return make_error(Errc::invalid_argument,
                          "--after: '" + text +
                              "' is not an event id (JOURNAL_ID-SEQ, as in an export's event_id)");
    if (parsed->journal_id != id.journal_id) {
        auto name = [](const std::string &j) {
            return j.empty() ? std::string("a journal without id") : "journal " + j;
        };
        return make_error(Errc::invalid_argument,
                          "--after: event " + text + " is of " + name(parsed->journal_id) +
                              ", but " + db + " is " + name(id.journal_id) +
                              ": an incremental export continues from the same journal");
    }
    return parsed->seq;
}

int verify_export_file(const std::string &file, bool allow_gaps, bool json) {
    auto fail = [&](const std::string &why) {
        std::cerr << "knod-policy audit verify: " << why << "\n";
        if (json)
            std::cout << knod::dump_json_escaped(
                             nlohmann::json{{"error", why}, {"command", "verify"}})
                      << "\n";
        return exit_usage;
    };
    std::ifstream f;
    if (file != "-") {
        f.open(file);
        if (!f) return fail("cannot read the export " + file + ": " + std::strerror(errno));
    }
    std::istream &in = file == "-" ? std::cin : f;
    auto c = journal::verify_export(in, allow_gaps);
    std::string name = file == "-" ? "stdin" : file;
    if (!c) return fail(name + ": " + c.error().message);
    if (json) {
        std::cout << knod::dump_json_escaped(nlohmann::json{{"ok", c->ok},
                                                            {"events_checked", c->events},
                                                            {"journal_id", c->journal_id},
                                                            {"first_seq", c->first_seq},
                                                            {"last_seq", c->last_seq},
                                                            {"first_prev_hash", c->first_prev_hash},
                                                            {"head_hash", c->head_hash},
                                                            {"gaps", c->gaps},
                                                            {"bad_line", c->bad_line},
                                                            {"bad_event_id", c->bad_event_id},
                                                            {"problem", c->problem}},
                                             2)
                  << "\n";
    } else if (!c->ok) {
        // The event id and journal id are the file's text: a newline in one could forge a line.
        std::cout << "FAILED: " << name << " line " << c->bad_line << " (event "
                  << escape_untrusted(c->bad_event_id, Escape::value, 256) << "): " << c->problem
                  << "\n";
    } else {
        std::cout << "ok: " << c->events << " event(s) of journal "
                  << (c->journal_id.empty() ? "(no id)"
                                            : escape_untrusted(c->journal_id, Escape::value, 256))
                  << ", events " << c->first_seq << "-" << c->last_seq
                  << ", match their hashes and chain";
        if (!c->gaps.empty()) std::cout << " except across " << c->gaps.size() << " allowed gap(s)";
        std::cout << "; head " << c->head_hash << "\n";
        if (c->first_seq > 1)
            std::cout << "the first event chains on from " << c->first_prev_hash
                      << ": the hash of event " << c->first_seq - 1
                      << " (the last of the previous export, or in the journal)\n";
    }
    return c->ok ? exit_ok : exit_failed;
}

} // namespace knod::cli
