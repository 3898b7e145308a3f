// Reads policy files (TOML) into a Policy, collecting every problem with file:line:col.
#pragma once

#include "policy/policy.h"

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace knod::policy {

enum class Severity { error, warning };

struct Diagnostic {
    Severity severity = Severity::error;
    SourceLocation where;
    std::string message;
    // "file:line:col: error: message", the form editors and compilers use.
    std::string to_string() const;
};

struct PolicyLoad {
    Policy policy;
    std::vector<Diagnostic> diagnostics;

    bool ok() const; // no errors (warnings are fine)
    std::size_t error_count() const;
    std::string errors_text() const; // every error, one per line
};

// The main file and its drop-ins, in the order they are read: ROOT/policy.toml, then
// ROOT/policy.d/*.toml in lexical order. Missing files are left out.
std::vector<std::string> default_policy_files(const std::string &root = "/etc/knod");

// Whether a directory entry named `name` is a policy file: it ends in ".toml" and does not
// start with "." (editor interlocks such as ".#a.toml", config tools' temporaries such as
// ".ansible_tmpXYZ-a.toml", hidden files nobody reviews). Swap files (".a.toml.swp") and
// backups ("a.toml~", "a.toml.dpkg-old") do not end in ".toml". Symlinks are followed; the
// entry must then be a regular file (the directory is root's: a link is root's choice).
bool is_policy_file_name(std::string_view name);

// The files the daemon, `check` and `explain` read for the paths given, in the order they are
// read (one function for all three, so the policy the daemon runs is the one the admin
// checked). No paths: default_policy_files(). A file is kept as given. A directory that holds
// policy.toml or policy.d/ is a policy root (default_policy_files(DIR)); any other directory is
// a drop-in directory: its policy files (is_policy_file_name) in lexical order.
std::vector<std::string> expand_policy_paths(const std::vector<std::string> &paths);

// Builds one policy from several sources, in order: rules are appended, later settings win.
class PolicyParser {
  public:
    void add_text(std::string_view text, const std::string &file);
    void add_file(const std::string &path);
    // Runs the checks that span rules (duplicate names, shadowed rules) and hands the result over.
    PolicyLoad finish();

  private:
    PolicyLoad load_;
};

PolicyLoad load_policy_files(const std::vector<std::string> &files);
PolicyLoad parse_policy_text(std::string_view text, const std::string &file = "<text>");

// The longest key_lifetime a rule may give: a year. Beyond it the daemon's clocks (int64
// nanoseconds from the epoch) would overflow long before the key expired; a holder that needs
// longer renews its key (Binding.Renew).
inline constexpr std::chrono::seconds max_key_lifetime{365 * 86400};

// Parses "256MiB", "1GiB", "4096"; and "90s", "15m", "1h", "2d", or plain seconds.
std::optional<std::uint64_t> parse_size(std::string_view text);
std::optional<std::chrono::seconds> parse_duration(std::string_view text);

} // namespace knod::policy
