#include "journal/compact_json.h"

#include "knod/json.h"

#include <algorithm>
#include <unordered_set>

namespace knod::journal {
namespace {

constexpr int max_depth = 64;
constexpr std::size_t max_digits = 18; // always an int64, dumped back digit for digit
constexpr std::size_t few_keys = 16;   // searched linearly below this many keys

class Scanner {
  public:
    explicit Scanner(std::string_view text) : s_(text) {}

    bool done() const { return i_ == s_.size(); }

    // A string token; `out`, when given, receives its decoded value.
    bool string(std::string *out) {
        if (!eat('"')) return false;
        for (;;) {
            if (i_ == s_.size()) return false;
            char c = s_[i_++];
            if (c == '"') return true;
            if (c == '\\') {
                if (i_ == s_.size() || (s_[i_] != '"' && s_[i_] != '\\')) return false;
                c = s_[i_++];
            } else if (c < 0x20 || c > 0x7e) {
                return false;
            }
            if (out) out->push_back(c);
        }
    }

    bool value(int depth) {
        if (i_ == s_.size() || depth >= max_depth) return false;
        switch (s_[i_]) {
        case '{':
            return object(depth + 1, nullptr);
        case '[':
            return array(depth + 1, nullptr);
        case '"':
            return string(nullptr);
        case 't':
            return literal("true");
        case 'f':
            return literal("false");
        case 'n':
            return literal("null");
        default:
            return number();
        }
    }

    // An object; `top`, when given, receives the members an export lifts out.
    bool object(int depth, CompactObject *top) {
        if (!eat('{')) return false;
        std::vector<std::string_view> keys; // raw key text: with only \" and \\ as escapes,
                                            // equal raw text is an equal key, and vice versa
        std::unordered_set<std::string_view> seen;
        if (eat('}')) return true;
        for (;;) {
            std::size_t start = i_;
            std::string key;
            if (!string(&key)) return false;
            std::string_view raw = s_.substr(start, i_ - start);
            // A few keys (the daemon's objects) are searched; more go in a hash set, so no
            // object costs N^2. Past max_json_object_keys the text is not the daemon's.
            if (keys.size() == max_json_object_keys) return false;
            if (!seen.empty() || keys.size() == few_keys) {
                if (seen.empty()) seen.insert(keys.begin(), keys.end());
                if (!seen.insert(raw).second) return false;
            } else if (std::find(keys.begin(), keys.end(), raw) != keys.end()) {
                return false;
            }
            keys.push_back(raw);
            if (!eat(':')) return false;
            bool ok = true;
            if (top && (key == "netdev" || key == "gpu") && peek('"')) {
                std::string v;
                ok = string(&v);
                (key == "netdev" ? top->netdev : top->gpu) = std::move(v);
            } else if (top && key == "flows") {
                std::vector<std::string> flows;
                if (!array(depth + 1, &flows)) return false; // not an array of strings
                top->flows = std::move(flows);
            } else {
                ok = value(depth);
            }
            if (!ok) return false;
            if (eat('}')) return true;
            if (!eat(',')) return false;
        }
    }

    // An array; `strings`, when given, requires every element to be a string and collects them.
    bool array(int depth, std::vector<std::string> *strings) {
        if (depth >= max_depth || !eat('[')) return false;
        if (eat(']')) return true;
        for (;;) {
            if (strings) {
                std::string v;
                if (!string(&v)) return false;
                strings->push_back(std::move(v));
            } else if (!value(depth)) {
                return false;
            }
            if (eat(']')) return true;
            if (!eat(',')) return false;
        }
    }

  private:
    bool peek(char c) const { return i_ < s_.size() && s_[i_] == c; }
    bool eat(char c) {
        if (!peek(c)) return false;
        ++i_;
        return true;
    }
    bool literal(std::string_view word) {
        if (s_.substr(i_, word.size()) != word) return false;
        i_ += word.size();
        return true;
    }
    bool number() {
        std::size_t start = i_;
        eat('-');
        std::size_t digits = i_;
        while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9')
            ++i_;
        std::size_t n = i_ - digits;
        if (n == 0 || n > max_digits) return false;
        if (s_[digits] == '0' && (n > 1 || digits > start)) return false; // "01", "-0"
        // A fraction or an exponent makes a double, whose dump may differ: the general path.
        return i_ == s_.size() || (s_[i_] != '.' && s_[i_] != 'e' && s_[i_] != 'E');
    }

    std::string_view s_;
    std::size_t i_ = 0;
};

} // namespace

std::optional<CompactObject> scan_compact_object(std::string_view text) {
    CompactObject top;
    Scanner s(text);
    if (!s.object(1, &top) || !s.done()) return std::nullopt;
    return top;
}

std::optional<std::vector<std::string>> scan_compact_string_array(std::string_view text) {
    std::vector<std::string> out;
    Scanner s(text);
    if (!s.array(1, &out) || !s.done()) return std::nullopt;
    return out;
}

} // namespace knod::journal
