// knod-policy audit report: the journal's counts over a period as tables, JSON or one HTML page.
// The JSON object is the one source: the tables and the page are drawn from it, so every view
// shows the same numbers.
#pragma once

#include "journal/reader.h"
#include "knod/result.h"

#include <nlohmann/json.hpp>

#include <string>

namespace knod::cli {

struct ReportRequest {
    std::string db;
    journal::Filter filter; // since, until, uid, netdev, gpu
    bool json = false;      // print JSON instead of tables
    std::string html;       // write the page here ("-": stdout); empty: no page
};

// The report as JSON (the shape is in `knod-policy audit report --help` and the man page).
// Users get their user and primary group names from this host's user database.
nlohmann::json report_json(const journal::Report &r, const journal::Filter &f);

// Reads the journal and prints (or writes) the report; errors say which step failed.
Result<void> run_report(const ReportRequest &req);

// The --help footer: what each view counts and the JSON shape.
extern const char *const report_help;

} // namespace knod::cli
