// Text from callers, /proc, cgroupfs, sysfs or policy files is bytes until checked. These turn it
// into text that is valid UTF-8 and holds no control character, so it can go into a log line, a
// JSON document, a D-Bus string, a CSV cell or a terminal without throwing or injecting anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace knod {

// The length of the well-formed UTF-8 sequence at s[i] (RFC 3629: no overlongs, no surrogates,
// nothing above U+10FFFF), or 0 if the bytes there are not one. `cp` gets the code point.
inline std::size_t utf8_sequence(std::string_view s, std::size_t i, char32_t &cp) {
    auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
    unsigned char b = byte(i);
    if (b < 0x80) {
        cp = b;
        return 1;
    }
    std::size_t len = b >= 0xc2 && b <= 0xdf   ? 2
                      : b >= 0xe0 && b <= 0xef ? 3
                      : b >= 0xf0 && b <= 0xf4 ? 4
                                               : 0;
    if (len == 0 || i + len > s.size()) return 0;
    cp = b & (0x7f >> len);
    for (std::size_t k = 1; k < len; ++k) {
        unsigned char c = byte(i + k);
        if ((c & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (c & 0x3f);
    }
    bool overlong = (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
    if (overlong || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

// C0, DEL and C1 controls (what a terminal may act on), and the bidirectional marks, embeddings,
// overrides and isolates (U+200E-200F, U+202A-202E, U+2066-2069) that make a terminal or a page
// show text in another order than it is ("Trojan Source").
inline bool is_control(char32_t cp) {
    return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x200e || cp == 0x200f ||
           (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

inline bool is_clean_text(std::string_view s) {
    char32_t cp = 0;
    for (std::size_t i = 0; i < s.size();) {
        std::size_t n = utf8_sequence(s, i, cp);
        if (n == 0 || is_control(cp)) return false;
        i += n;
    }
    return true;
}

enum class Escape {
    // Unambiguous: a backslash becomes "\\", so the original bytes can be recovered.
    value,
    // For whole messages to people: newlines and tabs stay, backslashes stay as they are.
    message,
};

// Valid, printable UTF-8 is kept; every other byte becomes "\xNN". At most `max_in` input bytes
// are read (cut at a character boundary).
inline std::string escape_untrusted(std::string_view s, Escape how = Escape::value,
                                    std::size_t max_in = std::string_view::npos) {
    static const char digits[] = "0123456789abcdef";
    std::string out;
    out.reserve(s.size() < 256 ? s.size() : 256);
    char32_t cp = 0;
    for (std::size_t i = 0; i < s.size() && i < max_in;) {
        std::size_t n = utf8_sequence(s, i, cp);
        bool keep_ws = how == Escape::message && (cp == '\n' || cp == '\t');
        if (n != 0 && (!is_control(cp) || keep_ws)) {
            if (i + n > max_in) break;
            if (cp == '\\' && how == Escape::value) out += '\\';
            out.append(s.substr(i, n));
            i += n;
            continue;
        }
        // One byte at a time: the next may start a valid sequence.
        for (std::size_t k = 0; k < (n ? n : 1); ++k) {
            auto b = static_cast<unsigned char>(s[i + k]);
            out += "\\x";
            out += digits[b >> 4];
            out += digits[b & 15];
        }
        i += n ? n : 1;
    }
    return out;
}

// For error messages: 'escaped prefix' and, if it was cut, how long the whole input was. Never
// more than about 4 * max + 40 bytes, whatever the input.
inline std::string quote_untrusted(std::string_view s, std::size_t max = 64) {
    std::string out = "'" + escape_untrusted(s, Escape::value, max) + "'";
    if (s.size() > max) out += "... (" + std::to_string(s.size()) + " bytes)";
    return out;
}

} // namespace knod
