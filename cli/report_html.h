// The audit report as one self-contained HTML page: inline SVG bar charts and tables, no
// scripts, nothing fetched (a Content-Security-Policy says so to the browser too). Every string
// from the journal (user, group, netdev, GPU, rule, decision names) is escaped for HTML after
// control characters and invalid UTF-8 are made visible as "\xNN".
//
// Each chart draws its bars in one solid colour of its own (data-bar-colour on its <svg>),
// axis-aligned on whole pixels, and nothing else on the page uses that colour (text, axes and
// table lines are grey): the page's test measures the bars in a screenshot.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace knod::cli {

struct HtmlContext {
    std::string journal;   // the journal's path, as given
    std::string generated; // when the page was made (UTC)
};

// `report` is the object report_json() makes.
std::string report_html(const nlohmann::json &report, const HtmlContext &ctx);

// Text for an HTML text node or a quoted attribute value.
std::string html_escape(std::string_view untrusted);

} // namespace knod::cli
