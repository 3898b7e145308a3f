#include "knod/json.h"
#include "knod/untrusted.h"

#include <gtest/gtest.h>

using namespace knod;

TEST(Untrusted, ValidPrintableUtf8IsKept) {
    EXPECT_EQ(escape_untrusted("/usr/bin/python3"), "/usr/bin/python3");
    EXPECT_EQ(escape_untrusted("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
              "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    EXPECT_TRUE(is_clean_text("caf\xc3\xa9"));
}

TEST(Untrusted, ControlsAndInvalidBytesAreEscaped) {
    EXPECT_EQ(escape_untrusted("a\xff/b"), "a\\xff/b");
    EXPECT_EQ(escape_untrusted("\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");
    EXPECT_EQ(escape_untrusted(std::string("x\0y", 3)), "x\\x00y");
    EXPECT_EQ(escape_untrusted("\xc2\x9b"), "\\xc2\\x9b");          // C1 CSI
    EXPECT_EQ(escape_untrusted("\xc0\xaf"), "\\xc0\\xaf");          // overlong '/'
    EXPECT_EQ(escape_untrusted("\xed\xa0\x80"), "\\xed\\xa0\\x80"); // a surrogate
    EXPECT_EQ(escape_untrusted("\xe2\x82"), "\\xe2\\x82");          // cut short
    EXPECT_EQ(escape_untrusted("a\\b"), "a\\\\b");                  // unambiguous
    EXPECT_EQ(escape_untrusted("a\\b\n\tc\r", Escape::message), "a\\b\n\tc\\x0d");
    for (const char *bad : {"\x7f", "a\nb", "\xff", "\xf5\x80\x80\x80"})
        EXPECT_FALSE(is_clean_text(bad)) << bad;
}

// A right-to-left override in a namespace or a rule name would make a table read "ok-team" for
// "maet-ko": bidirectional controls are escaped like C0 and C1 controls.
TEST(Untrusted, BidirectionalControlsAreEscaped) {
    EXPECT_EQ(escape_untrusted("team-\u202eevil"), "team-\\xe2\\x80\\xaeevil");
    EXPECT_EQ(escape_untrusted("a\u2066b\u200fc"), "a\\xe2\\x81\\xa6b\\xe2\\x80\\x8fc");
    EXPECT_FALSE(is_clean_text("x\u202ay"));
    EXPECT_EQ(escape_untrusted("caf\u00e9 \u2014 \u4e2d"), "caf\u00e9 \u2014 \u4e2d")
        << "other text stays";
}

TEST(Untrusted, QuotesAreShortWhateverTheInput) {
    std::string huge(30u << 20, 'x');
    std::string q = quote_untrusted(huge, 32);
    EXPECT_EQ(q, "'" + std::string(32, 'x') + "'... (31457280 bytes)");
    std::string escapes(1000, '\x1b');
    EXPECT_LE(quote_untrusted(escapes, 16).size(), 4u * 16 + 40);
    // A multi-byte character is not cut in half.
    EXPECT_EQ(quote_untrusted("ab\xc3\xa9", 3), "'ab'... (4 bytes)");
}

TEST(Untrusted, DumpJsonNeverThrows) {
    nlohmann::json j{{"exe", "/tmp/\xff/x"}};
    EXPECT_THROW((void)j.dump(), nlohmann::json::type_error);
    std::string text;
    EXPECT_NO_THROW(text = dump_json(j));
    EXPECT_TRUE(nlohmann::json::accept(text));
}
