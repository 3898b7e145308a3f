#include "journal/identity.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <fstream>

namespace knod::journal {

std::string event_id(const std::string &journal_id, std::int64_t seq) {
    return journal_id + "-" + std::to_string(seq);
}

JournalIdentity this_host() {
    JournalIdentity h;
    std::ifstream in("/etc/machine-id");
    std::string id;
    if (in >> id && id.size() == 32 && std::all_of(id.begin(), id.end(), [](unsigned char c) {
            return std::isxdigit(c) && !std::isupper(c);
        }))
        h.machine_id = id;
    char name[HOST_NAME_MAX + 1] = {};
    if (::gethostname(name, sizeof name - 1) == 0) h.hostname = name;
    return h;
}

Result<JournalIdentity> read_identity(Database &db) {
    JournalIdentity id;
    auto has =
        db.scalar("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'");
    if (!has) return has.error();
    if (*has == 0) return id;
    auto st = db.prepare("SELECT key, value FROM meta WHERE key IN "
                         "('journal_id', 'machine_id', 'hostname')");
    if (!st) return st.error();
    for (;;) {
        auto row = st->step();
        if (!row) return row.error();
        if (!*row) return id;
        std::string key = st->text(0);
        (key == "journal_id"   ? id.journal_id
         : key == "machine_id" ? id.machine_id
                               : id.hostname) = st->text(1);
    }
}

Result<void> write_host(Database &db, const JournalIdentity &host) {
    auto st = db.prepare("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)");
    if (!st) return st.error();
    for (auto &[key, value] :
         {std::pair<const char *, const std::string &>{"machine_id", host.machine_id},
          {"hostname", host.hostname}}) {
        st->bind(1, std::string(key)).bind(2, value);
        if (auto r = st->run(); !r) return r.error();
    }
    return {};
}

} // namespace knod::journal
