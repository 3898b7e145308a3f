// libFuzzer target: any bytes as a journal file, through what an auditor runs on a journal
// copied from a host it does not trust: open (the schema compared first), verify (chain,
// tables, integrity check), report (and its HTML page), events, sessions and export. Nothing
// may crash, hang or read out of bounds (ASan + UBSan); and a journal verify calls intact must
// give an export that verify --export calls intact too.
#include "cli/audit_report.h"
#include "cli/report_html.h"
#include "journal/export.h"
#include "journal/reader.h"
#include "journal/verify.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

namespace {

const std::string &journal_path() {
    static const std::string path = [] {
        char dir[] = "/tmp/knod-journal-fuzz-XXXXXX";
        if (!::mkdtemp(dir)) std::abort();
        ::setenv("KNOD_AUDIT_TIME_BUDGET", "5", 1); // a runaway read is an error, not a hang
        return std::string(dir) + "/journal.db";
    }();
    return path;
}

void write_file(const std::string &path, const std::uint8_t *data, std::size_t size) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) std::abort();
    for (std::size_t done = 0; done < size;) {
        ssize_t n = ::write(fd, data + done, size - done);
        if (n <= 0) std::abort();
        done += static_cast<std::size_t>(n);
    }
    ::close(fd);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
    using namespace knod::journal;
    const std::string &path = journal_path();
    write_file(path, data, size);

    auto verified = verify_chain(path, {}, {}, AnchorUse::ignore);
    auto reader = JournalReader::open(path);
    if (!reader) return 0;
    Filter all;
    if (auto report = reader->report(all)) {
        auto j = knod::cli::report_json(*report, all);
        auto page = knod::cli::report_html(j, {"fuzz", "2026-01-01T00:00:00Z"});
        if (page.empty()) __builtin_trap();
    }
    Filter some;
    some.limit = 50;
    (void)reader->sessions(some, [](const Session &) { return true; });
    (void)reader->events(some, [](const EventRecord &) { return true; });
    auto id = reader->identity();
    std::ostringstream out;
    auto n = export_jsonl(*reader, all, id ? *id : JournalIdentity{}, out);
    std::istringstream back(out.str());
    auto check = verify_export(back, false);
    // An intact chain exports as an intact export (the export's own checks may only be
    // stricter where a line's fields disagree, which an intact journal never makes).
    if (verified && verified->ok && n && *n > 0 && check && !check->ok) __builtin_trap();
    return 0;
}
