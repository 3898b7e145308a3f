#include "policy/parser.h"
#include "knod/dir.h"
#include "knod/regular_file.h"

#include "knod/untrusted.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <set>

namespace fs = std::filesystem;

namespace knod::policy {
namespace {

// Bounds on a policy file, checked on the raw text before toml++ sees it: toml++ recurses per
// nesting level and per dotted key part, and a key with tens of thousands of parts overflows the
// stack. Policy files are small and flat, so these are generous.
constexpr std::size_t max_policy_bytes = 1 << 20;
constexpr std::size_t max_nesting = 32;   // open [ and { at once
constexpr std::size_t max_key_parts = 32; // a.b.c has 3

// A cheap, conservative pass over TOML text: skips comments and strings, counts open brackets,
// and counts the dots in each run of key characters (a dotted key, a [table.header], or a float,
// which has at most one). Returns the first limit crossed, if any.
std::optional<std::pair<SourceLocation, std::string>> scan_limits(std::string_view text,
                                                                  const std::string &file) {
    if (text.size() > max_policy_bytes)
        return std::pair{SourceLocation{file, 1, 1}, "policy file is over the limit of " +
                                                         std::to_string(max_policy_bytes) +
                                                         " bytes"};
    std::uint32_t line = 1, col = 1;
    std::size_t depth = 0, dots = 0;
    auto is_key_char = [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == ' ' ||
               c == '\t';
    };
    // Advances past the string that starts at text[i]; keeps line and column right.
    auto skip_string = [&](std::size_t &i) {
        char quote = text[i];
        bool multi = text.substr(i, 3) == std::string(3, quote);
        bool escapes = quote == '"';
        std::size_t n = multi ? 3 : 1;
        i += n;
        col += static_cast<std::uint32_t>(n);
        while (i < text.size()) {
            char c = text[i];
            if (escapes && c == '\\' && i + 1 < text.size()) {
                if (text[i + 1] == '\n') {
                    ++line;
                    col = 0;
                }
                i += 2;
                col += 2;
                continue;
            }
            if (multi ? text.substr(i, 3) == std::string(3, quote) : c == quote) {
                i += n;
                col += static_cast<std::uint32_t>(n);
                return;
            }
            if (c == '\n') {
                if (!multi) return; // an unterminated string: toml++ reports it
                ++line;
                col = 0;
            }
            ++i;
            ++col;
        }
    };
    for (std::size_t i = 0; i < text.size();) {
        char c = text[i];
        if (c == '"' || c == '\'') {
            skip_string(i); // a quoted key part stays part of its run
            continue;
        }
        if (c == '#') {
            while (i < text.size() && text[i] != '\n')
                ++i;
            continue;
        }
        if (c == '.') {
            if (++dots >= max_key_parts)
                return std::pair{SourceLocation{file, line, col},
                                 "key has more than " + std::to_string(max_key_parts) +
                                     " dotted parts"};
        } else if (!is_key_char(c)) {
            dots = 0;
        }
        if (c == '[' || c == '{') {
            if (++depth > max_nesting)
                return std::pair{SourceLocation{file, line, col},
                                 "arrays, tables and inline tables nest deeper than " +
                                     std::to_string(max_nesting) + " levels"};
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
        if (c == '\n') {
            ++line;
            col = 1;
        } else {
            ++col;
        }
        ++i;
    }
    return std::nullopt;
}

SourceLocation at(const std::string &file, const toml::source_region &src) {
    return {file, src.begin.line, src.begin.column};
}

// Collects diagnostics for one file.
class FileReader {
  public:
    FileReader(PolicyLoad &load, std::string file) : load_(load), file_(std::move(file)) {}

    void error(const toml::source_region &src, std::string msg) {
        load_.diagnostics.push_back({Severity::error, at(file_, src), std::move(msg)});
    }
    void error_at(SourceLocation where, std::string msg) {
        load_.diagnostics.push_back({Severity::error, std::move(where), std::move(msg)});
    }
    void warning(const toml::source_region &src, std::string msg) {
        load_.diagnostics.push_back({Severity::warning, at(file_, src), std::move(msg)});
    }

    void read_document(const toml::table &doc) {
        for (auto &&[key, node] : doc) {
            if (key.str() == "settings") {
                if (auto *t = node.as_table())
                    read_settings(*t);
                else
                    error(node.source(), "'settings' must be a table: [settings]");
            } else if (key.str() == "rule") {
                auto *arr = node.as_array();
                if (!arr || !arr->is_array_of_tables()) {
                    error(node.source(), "'rule' must be an array of tables: [[rule]]");
                    continue;
                }
                for (auto &&element : *arr)
                    read_rule(*element.as_table());
            } else {
                error(key.source(), "unknown top-level key '" + std::string(key.str()) +
                                        "' (expected [settings] or [[rule]])");
            }
        }
    }

    // Policy strings are names, globs and flows: a NUL would cut a glob short for fnmatch (and
    // widen the rule), and other control characters hide text from whoever reads it. Returns
    // false if any key or string holds one.
    bool check_text(const toml::node &node) {
        bool clean = true;
        if (auto *t = node.as_table()) {
            for (auto &&[key, value] : *t) {
                if (!is_clean_text(key.str())) {
                    error(key.source(),
                          "key " + quote_untrusted(key.str()) + " holds a control character");
                    clean = false;
                }
                clean = check_text(value) && clean;
            }
        } else if (auto *a = node.as_array()) {
            for (auto &&el : *a)
                clean = check_text(el) && clean;
        } else if (auto *v = node.as_string()) {
            if (!is_clean_text(v->get())) {
                error(node.source(), "string " + quote_untrusted(v->get()) +
                                         " holds a control character; policy strings may not");
                clean = false;
            }
        }
        return clean;
    }

  private:
    void read_settings(const toml::table &t) {
        Settings &s = load_.policy.settings;
        for (auto &&[key, node] : t) {
            std::string_view k = key.str();
            if (k == "permissive") {
                if (auto v = node.value<bool>())
                    s.permissive = *v;
                else
                    error(node.source(), "'permissive' must be true or false");
            } else if (k == "auditor_group" || k == "admin_group") {
                auto v = string_value(node, k);
                if (v) (k == "auditor_group" ? s.auditor_group : s.admin_group) = *v;
            } else if (k == "unmatched_traffic") {
                auto v = string_value(node, k);
                if (!v) continue;
                if (*v == "pass")
                    s.unmatched_traffic = UnmatchedTraffic::pass;
                else if (*v == "drop")
                    s.unmatched_traffic = UnmatchedTraffic::drop;
                else
                    error(node.source(), "'unmatched_traffic' must be \"pass\" or \"drop\"");
            } else {
                error(key.source(), "unknown key '" + std::string(k) + "' in [settings]");
            }
        }
    }

    std::optional<std::string> string_value(const toml::node &node, std::string_view key) {
        if (auto v = node.value<std::string>()) return *v;
        error(node.source(), "'" + std::string(key) + "' must be a string");
        return std::nullopt;
    }

    // Accepts a single value or an array of them.
    template <typename Fn> void each_value(const toml::node &node, Fn fn) {
        if (auto *arr = node.as_array()) {
            for (auto &&el : *arr)
                fn(el);
        } else {
            fn(node);
        }
    }

    std::vector<std::string> strings(const toml::node &node, std::string_view key) {
        std::vector<std::string> out;
        each_value(node, [&](const toml::node &el) {
            if (auto v = el.value<std::string>()) {
                if (v->empty())
                    error(el.source(), "'" + std::string(key) + "' entries must not be empty");
                else
                    out.push_back(*v);
            } else {
                error(el.source(), "'" + std::string(key) + "' entries must be strings");
            }
        });
        return out;
    }

    // k8s_annotations = { "knod.io/profile" = "inference" }: keys under the project's prefix
    // (the CNI plugin passes no other annotation), values matched exactly.
    void read_annotations(const toml::node &node, Rule &rule) {
        const toml::table *t = node.as_table();
        if (!t) {
            error(node.source(), "'k8s_annotations' must be a table of \"" +
                                     std::string(pod_annotation_prefix) +
                                     "KEY\" = \"VALUE\" (an inline table: { ... })");
            return;
        }
        for (auto &&[key, value] : *t) {
            std::string k(key.str());
            auto v = value.value<std::string>();
            if (!k.starts_with(pod_annotation_prefix) ||
                k.size() == std::strlen(pod_annotation_prefix))
                error(key.source(), "k8s_annotations key '" +
                                        escape_untrusted(k, Escape::value, 256) +
                                        "' must start with '" + pod_annotation_prefix +
                                        "' (the plugin passes no other annotation)");
            else if (!v)
                error(value.source(), "k8s_annotations value of '" + k + "' must be a string");
            else
                rule.k8s_annotations[k] = *v;
        }
        if (t->empty()) error(node.source(), "'k8s_annotations' must not be empty");
    }

    std::vector<Principal> principals(const toml::node &node, std::string_view key) {
        std::vector<Principal> out;
        each_value(node, [&](const toml::node &el) {
            if (auto n = el.as_integer()) {
                std::int64_t v = n->get();
                if (v < 0 || v > 0xfffffffe)
                    error(el.source(), "'" + std::string(key) + "' id " + std::to_string(v) +
                                           " is out of range");
                else
                    out.push_back({static_cast<std::uint32_t>(v), {}});
            } else if (auto s = el.value<std::string>(); s && !s->empty()) {
                // "1000" is the id 1000, as in users = [1000]: no user or group name is all
                // digits (adduser refuses them), and a name that matches nobody would turn a
                // deny rule silently into nothing.
                std::uint64_t id = 0;
                auto [end, ec] = std::from_chars(s->data(), s->data() + s->size(), id);
                if (ec == std::errc() && end == s->data() + s->size()) {
                    if (id > 0xfffffffe)
                        error(el.source(),
                              "'" + std::string(key) + "' id " + *s + " is out of range");
                    else
                        out.push_back({static_cast<std::uint32_t>(id), {}});
                } else if (ec == std::errc::result_out_of_range) {
                    error(el.source(), "'" + std::string(key) + "' id " + quote_untrusted(*s, 64) +
                                           " is out of range");
                } else {
                    out.push_back({std::nullopt, *s});
                }
            } else {
                error(el.source(),
                      "'" + std::string(key) + "' entries must be names or numeric ids");
            }
        });
        return out;
    }

    std::optional<std::uint64_t> size_value(const toml::node &node, std::string_view key) {
        if (auto n = node.as_integer()) {
            if (n->get() > 0) return static_cast<std::uint64_t>(n->get());
        } else if (auto s = node.value<std::string>()) {
            if (auto v = parse_size(*s); v && *v > 0) return v;
        }
        error(node.source(), "'" + std::string(key) +
                                 "' must be a positive size: bytes, or a string like \"256MiB\"");
        return std::nullopt;
    }

    void read_flows(const toml::node &node, Rule &rule) {
        std::vector<std::pair<FlowSpec, toml::source_region>> seen;
        each_value(node, [&](const toml::node &el) {
            auto text = el.value<std::string>();
            if (!text) {
                error(el.source(), "'flows' entries must be flow-spec strings");
                return;
            }
            auto parsed = parse_flow_spec_at(*text);
            if (!parsed.ok) {
                // Point inside the string: the column after the opening quote, plus the offset.
                // Exact for basic single-line strings, the form flow specs are written in.
                SourceLocation where = at(file_, el.source());
                where.column += 1 + static_cast<std::uint32_t>(parsed.error.offset);
                error_at(where, "bad flow '" + *text + "': " + parsed.error.message);
                return;
            }
            for (auto &[other, other_src] : seen) {
                if (other.overlaps(parsed.spec)) {
                    error(el.source(), "flow '" + parsed.spec.to_string() + "' overlaps flow '" +
                                           other.to_string() + "' at line " +
                                           std::to_string(other_src.begin.line) +
                                           " (merge them or make them disjoint)");
                    return;
                }
            }
            seen.emplace_back(parsed.spec, el.source());
            rule.flows.push_back(parsed.spec);
        });
    }

    void read_rule(const toml::table &t) {
        Rule rule;
        rule.where = at(file_, t.source());
        std::size_t errors_before = load_.error_count();
        bool has_flows = false, has_region = false, any_caller = false;
        for (auto &&[key, node] : t) {
            std::string_view k = key.str();
            if (k == "name") {
                if (auto v = string_value(node, k)) rule.name = *v;
            } else if (k == "action") {
                auto v = string_value(node, k);
                if (!v) continue;
                if (*v == "allow")
                    rule.action = Action::allow;
                else if (*v == "deny")
                    rule.action = Action::deny;
                else
                    error(node.source(), "'action' must be \"allow\" or \"deny\"");
            } else if (k == "users") {
                rule.users = principals(node, k);
            } else if (k == "groups") {
                rule.groups = principals(node, k);
            } else if (k == "units") {
                rule.units = strings(node, k);
            } else if (k == "user_units") {
                rule.user_units = strings(node, k);
            } else if (k == "cgroups") {
                rule.cgroups = strings(node, k);
            } else if (k == "executables") {
                rule.executables = strings(node, k);
            } else if (k == "k8s_namespaces") {
                rule.k8s_namespaces = strings(node, k);
            } else if (k == "k8s_pods") {
                rule.k8s_pods = strings(node, k);
            } else if (k == "k8s_annotations") {
                read_annotations(node, rule);
            } else if (k == "netdevs") {
                rule.netdevs = strings(node, k);
            } else if (k == "gpus") {
                rule.gpus = strings(node, k);
            } else if (k == "modes") {
                rule.modes.clear();
                each_value(node, [&](const toml::node &el) {
                    auto s = el.value<std::string>();
                    auto m = s ? parse_mode(*s) : std::nullopt;
                    if (m)
                        rule.modes.push_back(*m);
                    else
                        error(el.source(), "mode must be \"rx-only\", \"tx\" or \"rx-tx\"");
                });
            } else if (k == "max_region") {
                has_region = true;
                rule.max_region_bytes = size_value(node, k);
            } else if (k == "flows") {
                has_flows = true;
                read_flows(node, rule);
            } else if (k == "max_bindings_per_uid") {
                auto n = node.as_integer();
                if (n && n->get() > 0 && n->get() <= 1'000'000)
                    rule.max_bindings_per_uid = static_cast<std::uint32_t>(n->get());
                else
                    error(node.source(), "'max_bindings_per_uid' must be an integer 1-1000000");
            } else if (k == "max_total_bytes_per_uid") {
                rule.max_total_bytes_per_uid = size_value(node, k);
            } else if (k == "iommu") {
                auto s = string_value(node, k);
                if (!s) continue;
                if (auto r = parse_iommu(*s))
                    rule.iommu = *r;
                else
                    error(node.source(),
                          "'iommu' must be \"translated\", \"passthrough-ok\" or \"any\"");
            } else if (k == "any_caller") {
                if (auto v = node.value<bool>())
                    any_caller = *v;
                else
                    error(node.source(), "'any_caller' must be true or false");
            } else if (k == "key_lifetime") {
                std::optional<std::chrono::seconds> d;
                if (auto n = node.as_integer(); n && n->get() > 0)
                    d = std::chrono::seconds(n->get());
                else if (auto s = node.value<std::string>())
                    d = parse_duration(*s);
                if (d && d->count() > 0 && *d <= max_key_lifetime)
                    rule.key_lifetime = *d;
                else
                    error(node.source(), "'key_lifetime' must be seconds or a duration like "
                                         "\"90s\", \"15m\", \"1h\", from 1s to 365d (a holder "
                                         "that needs longer renews its key)");
            } else {
                error(key.source(), "unknown key '" + std::string(k) + "' in [[rule]]");
            }
        }
        if (rule.name.empty())
            error(t.source(), "rule has no 'name' (decisions and the journal name it)");
        // An empty list matches anyone, so a rule whose principal lines are missing (a file
        // read half-saved, a line deleted by mistake) would match every caller: that must be
        // said, not fallen into.
        bool names_caller = !rule.users.empty() || !rule.groups.empty() || !rule.units.empty() ||
                            !rule.user_units.empty() || !rule.cgroups.empty() ||
                            !rule.executables.empty() || !rule.k8s_namespaces.empty() ||
                            !rule.k8s_pods.empty() || !rule.k8s_annotations.empty();
        if (!names_caller && !any_caller)
            error(t.source(), "rule '" + rule.name +
                                  "' names no caller (users, groups, units, user_units, cgroups, "
                                  "executables, k8s_namespaces, k8s_pods or k8s_annotations); a "
                                  "rule meant for every caller says 'any_caller = true'");
        // "*" names every caller of its kind (one without a unit too): as wide as any_caller.
        for (auto *globs : {&rule.units, &rule.user_units, &rule.cgroups, &rule.executables,
                            &rule.k8s_namespaces, &rule.k8s_pods})
            for (auto &g : *globs)
                if (g.find_first_not_of("*?/") == std::string::npos)
                    warning(t.source(), "rule '" + rule.name + "' has the glob '" + g +
                                            "', which matches (almost) every caller; if that is "
                                            "meant, say 'any_caller = true'");
        if (names_caller && any_caller)
            error(t.source(), "rule '" + rule.name +
                                  "' sets 'any_caller = true' and also names callers; keep one");
        if (rule.action == Action::allow) {
            if (!has_region)
                error(t.source(), "allow rule '" + rule.name +
                                      "' must set 'max_region' (the largest region per binding)");
            if (!has_flows)
                error(t.source(), "allow rule '" + rule.name +
                                      "' must set 'flows' (the traffic a binding may receive)");
            // An empty list would mean "any flow" to the engine: never by writing nothing.
            else if (rule.flows.empty() && load_.error_count() == errors_before)
                error(t.source(), "allow rule '" + rule.name +
                                      "' has 'flows = []': list the traffic a binding may "
                                      "receive (\"udp * -> *:*\" for all of it)");
            for (Mode m : rule.modes)
                if (m != Mode::rx_only)
                    warning(t.source(),
                            std::string("rule '") + rule.name + "' grants mode " + to_string(m) +
                                ", which no driver supports yet; such requests are refused");
        }
        if (load_.error_count() == errors_before) load_.policy.rules.push_back(std::move(rule));
    }

    PolicyLoad &load_;
    std::string file_;
};

template <typename T> bool subset(const std::vector<T> &inner, const std::vector<T> &outer) {
    return std::all_of(inner.begin(), inner.end(), [&](const T &x) {
        return std::find(outer.begin(), outer.end(), x) != outer.end();
    });
}

// An empty list means "any"; a list of strings containing "*" also means any.
bool covers(const std::vector<std::string> &a, const std::vector<std::string> &b) {
    if (a.empty() || std::find(a.begin(), a.end(), "*") != a.end()) return true;
    return !b.empty() && subset(b, a);
}
bool covers(const std::vector<Principal> &a, const std::vector<Principal> &b) {
    return a.empty() || (!b.empty() && subset(b, a));
}

// True when every request that `later` matches is matched by `earlier` first.
bool shadows(const Rule &earlier, const Rule &later) {
    if (!covers(earlier.users, later.users) || !covers(earlier.groups, later.groups) ||
        !covers(earlier.units, later.units) || !covers(earlier.user_units, later.user_units) ||
        !covers(earlier.cgroups, later.cgroups) ||
        !covers(earlier.executables, later.executables) ||
        !covers(earlier.k8s_namespaces, later.k8s_namespaces) ||
        !covers(earlier.k8s_pods, later.k8s_pods) ||
        !std::all_of(earlier.k8s_annotations.begin(), earlier.k8s_annotations.end(),
                     [&](auto &kv) {
                         auto it = later.k8s_annotations.find(kv.first);
                         return it != later.k8s_annotations.end() && it->second == kv.second;
                     }) ||
        !covers(earlier.netdevs, later.netdevs) || !covers(earlier.gpus, later.gpus) ||
        !subset(later.modes, earlier.modes))
        return false;
    if (earlier.max_region_bytes &&
        (!later.max_region_bytes || *later.max_region_bytes > *earlier.max_region_bytes))
        return false;
    if (earlier.flows.empty()) return true;
    if (later.flows.empty()) return false;
    return std::all_of(later.flows.begin(), later.flows.end(), [&](const FlowSpec &f) {
        return std::any_of(earlier.flows.begin(), earlier.flows.end(),
                           [&](const FlowSpec &g) { return g.contains(f); });
    });
}

std::uint64_t checked_multiply(std::uint64_t v, std::uint64_t unit, bool &overflow) {
    if (v > UINT64_MAX / unit) overflow = true;
    return v * unit;
}

std::optional<std::pair<std::uint64_t, std::string_view>> number_and_suffix(std::string_view t) {
    std::uint64_t v = 0;
    auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec != std::errc{} || end == t.data()) return std::nullopt;
    std::string_view suffix(end, static_cast<std::size_t>(t.data() + t.size() - end));
    while (!suffix.empty() && suffix.front() == ' ')
        suffix.remove_prefix(1);
    return std::make_pair(v, suffix);
}

} // namespace

std::string SourceLocation::to_string() const {
    return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

std::string Diagnostic::to_string() const {
    return where.to_string() + (severity == Severity::error ? ": error: " : ": warning: ") +
           message;
}

bool PolicyLoad::ok() const {
    return error_count() == 0;
}

std::size_t PolicyLoad::error_count() const {
    return static_cast<std::size_t>(
        std::count_if(diagnostics.begin(), diagnostics.end(),
                      [](auto &d) { return d.severity == Severity::error; }));
}

std::string PolicyLoad::errors_text() const {
    std::string out;
    for (auto &d : diagnostics)
        if (d.severity == Severity::error) out += d.to_string() + "\n";
    return out;
}

std::optional<std::uint64_t> parse_size(std::string_view text) {
    auto parsed = number_and_suffix(text);
    if (!parsed) return std::nullopt;
    auto [v, suffix] = *parsed;
    static const std::pair<std::string_view, std::uint64_t> units[] = {{"", 1},
                                                                       {"B", 1},
                                                                       {"KiB", 1ull << 10},
                                                                       {"MiB", 1ull << 20},
                                                                       {"GiB", 1ull << 30},
                                                                       {"TiB", 1ull << 40},
                                                                       {"kB", 1000},
                                                                       {"MB", 1000'000},
                                                                       {"GB", 1000'000'000}};
    for (auto &[name, unit] : units) {
        if (suffix != name) continue;
        bool overflow = false;
        std::uint64_t bytes = checked_multiply(v, unit, overflow);
        if (overflow) return std::nullopt;
        return bytes;
    }
    return std::nullopt;
}

std::optional<std::chrono::seconds> parse_duration(std::string_view text) {
    auto parsed = number_and_suffix(text);
    if (!parsed) return std::nullopt;
    auto [v, suffix] = *parsed;
    static const std::pair<std::string_view, std::uint64_t> units[] = {
        {"", 1}, {"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400}};
    for (auto &[name, unit] : units) {
        if (suffix != name) continue;
        bool overflow = false;
        std::uint64_t secs = checked_multiply(v, unit, overflow);
        if (overflow || secs > (1ull << 40)) return std::nullopt;
        return std::chrono::seconds(static_cast<std::int64_t>(secs));
    }
    return std::nullopt;
}

void PolicyParser::add_text(std::string_view text, const std::string &file) {
    load_.policy.files.push_back(file);
    load_.policy.file_digests.push_back(policy_digest(text));
    std::string &all = load_.policy.text; // the canonical text (policy.h)
    all += "# file: " + file + "\n";
    all += text;
    if (!text.empty() && text.back() != '\n') all += '\n';
    FileReader reader(load_, file);
    if (auto over = scan_limits(text, file)) return reader.error_at(over->first, over->second);
    try {
        toml::table doc = toml::parse(text, file);
        if (reader.check_text(doc)) reader.read_document(doc);
    } catch (const toml::parse_error &e) {
        reader.error(e.source(), std::string(e.description()));
    }
}

void PolicyParser::add_file(const std::string &path) {
    // One byte over the cap is enough to refuse the file; the rest is never read. A FIFO, a
    // device or a read error (/proc/self/mem) is an error, never a wait or an empty policy.
    auto text = read_regular_file_unchanged(path, max_policy_bytes);
    if (!text) {
        load_.diagnostics.push_back(
            {Severity::error, {path, 0, 0}, "cannot read policy file: " + text.error().message});
        return;
    }
    add_text(*text, path);
}

PolicyLoad PolicyParser::finish() {
    load_.policy.digest = policy_digest(load_.policy.text);
    auto &rules = load_.policy.rules;
    for (std::size_t i = 0; i < rules.size(); ++i) {
        for (std::size_t j = 0; j < i; ++j) {
            if (rules[j].name == rules[i].name) {
                load_.diagnostics.push_back({Severity::error, rules[i].where,
                                             "duplicate rule name '" + rules[i].name +
                                                 "' (first at " + rules[j].where.to_string() +
                                                 ")"});
                break;
            }
            if (shadows(rules[j], rules[i])) {
                load_.diagnostics.push_back(
                    {Severity::warning, rules[i].where,
                     "rule '" + rules[i].name + "' can never match: rule '" + rules[j].name +
                         "' at " + rules[j].where.to_string() + " matches everything it does"});
                break;
            }
        }
    }
    return std::move(load_);
}

PolicyLoad load_policy_files(const std::vector<std::string> &files) {
    PolicyParser parser;
    for (auto &f : files)
        parser.add_file(f);
    return parser.finish();
}

PolicyLoad parse_policy_text(std::string_view text, const std::string &file) {
    PolicyParser parser;
    parser.add_text(text, file);
    return parser.finish();
}

bool is_policy_file_name(std::string_view name) {
    constexpr std::string_view ext = ".toml";
    return name.size() > ext.size() && name.front() != '.' &&
           name.substr(name.size() - ext.size()) == ext;
}

namespace {

std::vector<std::string> dropin_files(const std::string &dir) {
    std::vector<std::string> found;
    std::error_code ec;
    for (auto &entry : knod::list_dir(dir, ec))
        if (is_policy_file_name(entry.filename().string()) && fs::is_regular_file(entry, ec))
            found.push_back(entry.string());
    std::sort(found.begin(), found.end());
    return found;
}

} // namespace

std::vector<std::string> expand_policy_paths(const std::vector<std::string> &paths) {
    if (paths.empty()) return default_policy_files();
    std::vector<std::string> out;
    for (auto &p : paths) {
        std::error_code ec;
        if (!fs::is_directory(p, ec)) {
            out.push_back(p);
            continue;
        }
        bool root = fs::exists(p + "/policy.toml", ec) || fs::is_directory(p + "/policy.d", ec);
        auto more = root ? default_policy_files(p) : dropin_files(p);
        out.insert(out.end(), more.begin(), more.end());
    }
    return out;
}

std::vector<std::string> default_policy_files(const std::string &root) {
    std::vector<std::string> out;
    std::error_code ec;
    std::string main = root + "/policy.toml";
    if (fs::exists(main, ec)) out.push_back(main);
    if (fs::is_directory(root + "/policy.d", ec)) {
        auto dropins = dropin_files(root + "/policy.d");
        out.insert(out.end(), dropins.begin(), dropins.end());
    }
    return out;
}

} // namespace knod::policy
