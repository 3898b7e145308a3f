#include "policy/flow_spec.h"

#include "knod/untrusted.h"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <optional>

namespace knod::policy {
namespace {

int width(Family f) {
    return f == Family::ipv4 ? 32 : 128;
}

// True when the first `bits` bits of a and b agree.
bool same_leading_bits(const std::uint8_t *a, const std::uint8_t *b, int bits) {
    int whole = bits / 8;
    if (std::memcmp(a, b, whole) != 0) return false;
    int rest = bits % 8;
    if (rest == 0) return true;
    auto mask = static_cast<std::uint8_t>(0xff << (8 - rest));
    return (a[whole] & mask) == (b[whole] & mask);
}

bool host_bits_clear(const Prefix &p) {
    int total = width(p.family);
    for (int bit = p.length; bit < total; ++bit)
        if (p.addr[bit / 8] & (0x80 >> (bit % 8))) return false;
    return true;
}

class Cursor {
  public:
    explicit Cursor(std::string_view text) : text_(text) {}

    void skip_space() {
        while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t'))
            ++pos_;
    }
    bool done() const { return pos_ >= text_.size(); }
    char peek() const { return done() ? '\0' : text_[pos_]; }
    bool consume(std::string_view token) {
        if (text_.substr(pos_, token.size()) != token) return false;
        pos_ += token.size();
        return true;
    }
    // The longest run of characters for which `pred` holds.
    template <typename Pred> std::string_view take_while(Pred pred) {
        std::size_t start = pos_;
        while (pos_ < text_.size() && pred(text_[pos_]))
            ++pos_;
        return text_.substr(start, pos_ - start);
    }
    std::size_t pos() const { return pos_; }

  private:
    std::string_view text_;
    std::size_t pos_ = 0;
};

struct Failure {
    std::size_t offset;
    std::string message;
};

bool parse_number(std::string_view digits, unsigned long max, unsigned long &out) {
    if (digits.empty() || digits.size() > 6) return false;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out);
    return ec == std::errc{} && end == digits.data() + digits.size() && out <= max;
}

bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

// PORTS := '*' | N | LO-HI
bool parse_ports(Cursor &c, PortRange &out, Failure &fail) {
    std::size_t at = c.pos();
    if (c.consume("*")) {
        out = {};
        return true;
    }
    unsigned long lo = 0, hi = 0;
    if (!parse_number(c.take_while(is_digit), 65535, lo)) {
        fail = {at, "expected a port (0-65535), a range LO-HI or '*'"};
        return false;
    }
    hi = lo;
    if (c.consume("-")) {
        std::size_t hi_at = c.pos();
        if (!parse_number(c.take_while(is_digit), 65535, hi)) {
            fail = {hi_at, "expected the upper port of the range (0-65535)"};
            return false;
        }
        if (hi < lo) {
            fail = {at, "inverted port range " + std::to_string(lo) + "-" + std::to_string(hi) +
                            " (the lower port comes first)"};
            return false;
        }
    }
    out = {static_cast<std::uint16_t>(lo), static_cast<std::uint16_t>(hi)};
    return true;
}

bool parse_prefix(std::string_view text, std::size_t at, Family family, Prefix &out,
                  Failure &fail) {
    std::string_view addr = text;
    std::optional<std::size_t> slash_pos;
    if (auto slash = text.find('/'); slash != std::string_view::npos) {
        addr = text.substr(0, slash);
        slash_pos = slash;
    }
    out = {};
    out.family = family;
    std::string addr_copy(addr);
    int af = family == Family::ipv4 ? AF_INET : AF_INET6;
    if (inet_pton(af, addr_copy.c_str(), out.addr.data()) != 1) {
        fail = {at, quote_untrusted(addr_copy) + " is not an " +
                        (family == Family::ipv4 ? "IPv4" : "IPv6") + " address"};
        return false;
    }
    unsigned long length = static_cast<unsigned long>(width(family));
    if (slash_pos) {
        std::string_view digits = text.substr(*slash_pos + 1);
        if (!parse_number(digits, static_cast<unsigned long>(width(family)), length) ||
            !std::all_of(digits.begin(), digits.end(), is_digit)) {
            fail = {at + *slash_pos + 1,
                    "prefix length must be 0-" + std::to_string(width(family))};
            return false;
        }
    }
    out.length = static_cast<std::uint8_t>(length);
    if (!host_bits_clear(out)) {
        fail = {at, "prefix " + quote_untrusted(text) + " has host bits set beyond /" +
                        std::to_string(length) + " (did you mean " + out.to_string() + "?)"};
        // to_string prints the masked network so the hint is right.
        return false;
    }
    return true;
}

// ENDPOINT := '*' | ADDRESS [':' PORTS]
bool parse_endpoint(Cursor &c, Endpoint &out, Failure &fail) {
    out = {};
    std::size_t at = c.pos();
    if (c.consume("[")) {
        std::size_t addr_at = c.pos();
        std::string_view inner = c.take_while([](char ch) { return ch != ']'; });
        if (!c.consume("]")) {
            fail = {at, "missing ']' after IPv6 address"};
            return false;
        }
        if (!parse_prefix(inner, addr_at, Family::ipv6, out.prefix, fail)) return false;
    } else if (c.consume("*")) {
        // any address
    } else {
        std::string_view text =
            c.take_while([](char ch) { return is_digit(ch) || ch == '.' || ch == '/'; });
        if (text.empty()) {
            fail = {at, "expected an address: '*', an IPv4 prefix, or [IPv6 prefix]"};
            return false;
        }
        if (!parse_prefix(text, at, Family::ipv4, out.prefix, fail)) return false;
    }
    if (c.consume(":")) return parse_ports(c, out.ports, fail);
    return true;
}

bool parse(std::string_view text, FlowSpec &spec, Failure &fail) {
    Cursor c(text);
    c.skip_space();
    std::size_t proto_at = c.pos();
    std::string_view proto = c.take_while([](char ch) { return ch != ' ' && ch != '\t'; });
    if (proto == "udp") {
        spec.protocol = Protocol::udp;
    } else if (proto == "tcp") {
        spec.protocol = Protocol::tcp;
    } else if (proto == "any" || proto == "*") {
        spec.protocol = Protocol::any;
    } else {
        fail = {proto_at,
                "unknown protocol " + quote_untrusted(proto, 16) + " (use udp, tcp or any)"};
        return false;
    }
    c.skip_space();
    if (!parse_endpoint(c, spec.src, fail)) return false;
    c.skip_space();
    if (!c.consume("->")) {
        fail = {c.pos(), "expected '->' between source and destination"};
        return false;
    }
    c.skip_space();
    if (!parse_endpoint(c, spec.dst, fail)) return false;
    c.skip_space();
    if (!c.done()) {
        fail = {c.pos(), "unexpected text after the destination"};
        return false;
    }
    Family s = spec.src.prefix.family, d = spec.dst.prefix.family;
    if (s != Family::any && d != Family::any && s != d) {
        fail = {0, "source and destination are of different address families"};
        return false;
    }
    return true;
}

} // namespace

bool Prefix::contains(const Prefix &o) const {
    if (family == Family::any) return true;
    if (o.family != family) return false;
    return length <= o.length && same_leading_bits(addr.data(), o.addr.data(), length);
}

bool Prefix::overlaps(const Prefix &o) const {
    if (family == Family::any || o.family == Family::any) return true;
    if (family != o.family) return false;
    return same_leading_bits(addr.data(), o.addr.data(), std::min(length, o.length));
}

bool Prefix::matches(Family f, const std::uint8_t *address) const {
    if (family == Family::any) return true;
    return f == family && same_leading_bits(addr.data(), address, length);
}

std::string Prefix::to_string() const {
    if (family == Family::any) return "*";
    // Mask host bits so that hints built from a bad prefix show the network.
    Prefix masked = *this;
    for (int bit = length; bit < width(family); ++bit)
        masked.addr[bit / 8] &= static_cast<std::uint8_t>(~(0x80 >> (bit % 8)));
    char buf[INET6_ADDRSTRLEN] = {};
    inet_ntop(family == Family::ipv4 ? AF_INET : AF_INET6, masked.addr.data(), buf, sizeof buf);
    std::string text = buf;
    if (length != width(family)) text += "/" + std::to_string(length);
    return family == Family::ipv6 ? "[" + text + "]" : text;
}

std::string PortRange::to_string() const {
    if (any()) return "*";
    if (lo == hi) return std::to_string(lo);
    return std::to_string(lo) + "-" + std::to_string(hi);
}

std::string Endpoint::to_string() const {
    if (prefix.family == Family::any && ports.any()) return "*";
    return prefix.to_string() + ":" + ports.to_string();
}

Family FlowSpec::family() const {
    return src.prefix.family != Family::any ? src.prefix.family : dst.prefix.family;
}

bool FlowSpec::contains(const FlowSpec &o) const {
    if (protocol != Protocol::any && protocol != o.protocol) return false;
    // An any-family endpoint in `o` is only contained in an any-family endpoint here.
    return src.contains(o.src) && dst.contains(o.dst);
}

bool FlowSpec::overlaps(const FlowSpec &o) const {
    if (protocol != Protocol::any && o.protocol != Protocol::any && protocol != o.protocol)
        return false;
    Family a = family(), b = o.family();
    if (a != Family::any && b != Family::any && a != b) return false;
    return src.overlaps(o.src) && dst.overlaps(o.dst);
}

bool FlowSpec::matches(const FiveTuple &p) const {
    if (protocol != Protocol::any && protocol != p.protocol) return false;
    return src.prefix.matches(p.family, p.src.data()) &&
           dst.prefix.matches(p.family, p.dst.data()) && src.ports.lo <= p.src_port &&
           p.src_port <= src.ports.hi && dst.ports.lo <= p.dst_port && p.dst_port <= dst.ports.hi;
}

std::string FlowSpec::to_string() const {
    const char *proto = protocol == Protocol::udp   ? "udp"
                        : protocol == Protocol::tcp ? "tcp"
                                                    : "any";
    return std::string(proto) + " " + src.to_string() + " -> " + dst.to_string();
}

FlowSpecParse parse_flow_spec_at(std::string_view text) {
    FlowSpecParse out;
    Failure fail{0, {}};
    out.ok = parse(text, out.spec, fail);
    if (!out.ok) out.error = {fail.offset, std::move(fail.message)};
    return out;
}

Result<FlowSpec> parse_flow_spec(std::string_view text) {
    auto parsed = parse_flow_spec_at(text);
    if (!parsed.ok)
        return make_error(Errc::invalid_argument, "flow " + quote_untrusted(text, 128) +
                                                      " at character " +
                                                      std::to_string(parsed.error.offset + 1) +
                                                      ": " + parsed.error.message);
    return parsed.spec;
}

} // namespace knod::policy
