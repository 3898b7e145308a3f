// `knod-policy metrics`: the daemon's figures (Manager.GetMetrics' JSON) in Prometheus' text
// exposition format (version 0.0.4), named by Prometheus' conventions: one knod_ prefix, base
// units, _total on counters. Every label value is escaped; nothing here trusts the JSON's
// strings (rule names come from the policy, netdevs from the kernel).
#pragma once

#include "knod/result.h"

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace knod::cli {

// A label value as the exposition format needs it: valid UTF-8 (other bytes and control
// characters other than newline and tab become "\xNN" text), then backslash, double quote and
// newline escaped as \\, \" and \n.
std::string prom_label_value(std::string_view raw);

// The exposition text for GetMetrics' JSON. Missing or mistyped fields are left out, never
// guessed.
// With job_tags, also knod_job_bindings: live bindings per job tag (Binding.SetJob). Off
// unless asked (--job-tags): a tag is a value each holder chooses, so every new one is a new
// series that Prometheus keeps for its retention, however few are live at once.
std::string render_metrics(const nlohmann::json &m, bool job_tags = false);

// What the file says when the daemon could not be asked: knod_up 0 and nothing else, so stale
// figures never outlive the daemon that had them.
std::string render_down();

// Writes `text` as DIR/NAME atomically, as node_exporter's textfile collector needs: a
// temporary file in DIR (a name the collector does not read), mode 0640 and group `gid` (the
// collector's: per-rule figures are not every local user's, issue #51), fsync, rename over
// NAME, fsync of DIR. A reader sees the old file or the new one, never half of one.
Result<void> write_textfile(const std::string &dir, const std::string &name,
                            const std::string &text, gid_t gid);

} // namespace knod::cli
