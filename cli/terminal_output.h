// Everything knod-policy prints passes through here: journal rows, daemon replies and policy
// diagnostics carry other users' bytes (executable paths, unit names), and a raw ESC or invalid
// UTF-8 on an auditor's terminal can rewrite what it shows. Newlines and tabs pass; every other
// control character (DEL, C1 and the bidi controls included) and every byte that is not valid
// UTF-8 is printed as "\xNN", which is no JSON escape: JSON output is made with
// knod::dump_json_escaped (knod/json.h), which \u-escapes all of them and replaces invalid UTF-8,
// so this finds nothing in it to rewrite.
#pragma once

#include <memory>
#include <ostream>
#include <streambuf>
#include <string>

namespace knod::cli {

class EscapingStreambuf : public std::streambuf {
  public:
    explicit EscapingStreambuf(std::streambuf *out) : out_(out) {}
    ~EscapingStreambuf() override;

  protected:
    int_type overflow(int_type ch) override;
    std::streamsize xsputn(const char *s, std::streamsize n) override;
    int sync() override;

  private:
    void put(unsigned char c);
    void flush_pending();

    std::streambuf *out_;
    std::string pending_; // the start of a multi-byte sequence, until it is complete or broken
};

// Puts an EscapingStreambuf in front of `stream` for the guard's lifetime.
class EscapeOutput {
  public:
    explicit EscapeOutput(std::ostream &stream);
    ~EscapeOutput();
    EscapeOutput(const EscapeOutput &) = delete;
    EscapeOutput &operator=(const EscapeOutput &) = delete;

  private:
    std::ostream &stream_;
    std::streambuf *original_;
    std::unique_ptr<EscapingStreambuf> buf_;
};

} // namespace knod::cli
