#include "cli/terminal_output.h"

#include "knod/untrusted.h"

namespace knod::cli {
namespace {

// How many bytes the sequence that starts with `lead` has (1 for anything that cannot start one).
std::size_t sequence_length(unsigned char lead) {
    return lead >= 0xc2 && lead <= 0xdf   ? 2
           : lead >= 0xe0 && lead <= 0xef ? 3
           : lead >= 0xf0 && lead <= 0xf4 ? 4
                                          : 1;
}

} // namespace

EscapingStreambuf::~EscapingStreambuf() {
    flush_pending();
    out_->pubsync();
}

void EscapingStreambuf::flush_pending() {
    if (pending_.empty()) return;
    std::string text = escape_untrusted(pending_, Escape::message);
    out_->sputn(text.data(), static_cast<std::streamsize>(text.size()));
    pending_.clear();
}

void EscapingStreambuf::put(unsigned char c) {
    // A byte that cannot continue the pending sequence ends it (as invalid) and starts afresh.
    if (!pending_.empty() && (c & 0xc0) != 0x80) flush_pending();
    pending_ += static_cast<char>(c);
    auto lead = static_cast<unsigned char>(pending_[0]);
    if (pending_.size() >= sequence_length(lead)) flush_pending();
}

EscapingStreambuf::int_type EscapingStreambuf::overflow(int_type ch) {
    if (traits_type::eq_int_type(ch, traits_type::eof())) return traits_type::not_eof(ch);
    put(static_cast<unsigned char>(traits_type::to_char_type(ch)));
    return ch;
}

std::streamsize EscapingStreambuf::xsputn(const char *s, std::streamsize n) {
    // Runs of plain printable ASCII go straight through; the rest byte by byte.
    std::streamsize i = 0;
    while (i < n) {
        std::streamsize j = i;
        while (pending_.empty() && j < n) {
            auto c = static_cast<unsigned char>(s[j]);
            if (c >= 0x80 || (c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) break;
            ++j;
        }
        if (j > i) {
            out_->sputn(s + i, j - i);
            i = j;
            continue;
        }
        put(static_cast<unsigned char>(s[i++]));
    }
    return n;
}

int EscapingStreambuf::sync() {
    // A sequence cut by a flush may still be completed by the next write: keep it pending.
    return out_->pubsync();
}

EscapeOutput::EscapeOutput(std::ostream &stream)
    : stream_(stream), original_(stream.rdbuf()),
      buf_(std::make_unique<EscapingStreambuf>(original_)) {
    stream_.rdbuf(buf_.get());
}

EscapeOutput::~EscapeOutput() {
    stream_.flush();
    stream_.rdbuf(original_);
}

} // namespace knod::cli
