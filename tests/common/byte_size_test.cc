// ParseByteSize: the one reading of a byte size (common/byte_size.h), which the server's
// flags, its quota file, the CLI and the benchmarks share.
#include "common/byte_size.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace gpucompute {
namespace {

TEST(ByteSizeTest, PlainNumbersAreBytes) {
  EXPECT_EQ(ParseByteSize("0").value(), 0u);
  EXPECT_EQ(ParseByteSize("4096").value(), 4096u);
  EXPECT_EQ(ParseByteSize("4096B").value(), 4096u);
  EXPECT_EQ(ParseByteSize("4096b").value(), 4096u);
  EXPECT_EQ(ParseByteSize("  512MiB \n").value(), 512u << 20) << "white space around is ignored";
}

TEST(ByteSizeTest, DecimalUnitsArePowersOf1000) {
  for (const char* text : {"1k", "1K", "1kB", "1KB", "1kb"}) {
    EXPECT_EQ(ParseByteSize(text).value(), 1000u) << text;
  }
  for (const char* text : {"1M", "1m", "1MB", "1mb"}) {
    EXPECT_EQ(ParseByteSize(text).value(), 1000000u) << text;
  }
  for (const char* text : {"1G", "1g", "1GB", "1gb"}) {
    EXPECT_EQ(ParseByteSize(text).value(), 1000000000u) << text;
  }
  for (const char* text : {"1T", "1TB", "1tb"}) {
    EXPECT_EQ(ParseByteSize(text).value(), 1000000000000u) << text;
  }
}

TEST(ByteSizeTest, BinaryUnitsArePowersOf1024) {
  for (const char* text : {"1Ki", "1KiB", "1kib", "1KIB"}) {
    EXPECT_EQ(ParseByteSize(text).value(), 1024u) << text;
  }
  for (const char* text : {"1Mi", "1MiB", "1mib"}) {
    EXPECT_EQ(ParseByteSize(text).value(), uint64_t{1} << 20) << text;
  }
  for (const char* text : {"8Gi", "8GiB", "8gib"}) {
    EXPECT_EQ(ParseByteSize(text).value(), uint64_t{8} << 30) << text;
  }
  for (const char* text : {"2Ti", "2TiB"}) {
    EXPECT_EQ(ParseByteSize(text).value(), uint64_t{2} << 40) << text;
  }
  EXPECT_EQ(ParseByteSize("4160KiB").value(), 4259840u);
}

TEST(ByteSizeTest, FractionsMustComeToWholeBytes) {
  EXPECT_EQ(ParseByteSize("1.5GiB").value(), uint64_t{3} << 29);
  EXPECT_EQ(ParseByteSize("1.5GB").value(), 1500000000u);
  EXPECT_EQ(ParseByteSize("0.5Ki").value(), 512u);
  EXPECT_EQ(ParseByteSize("2.000").value(), 2u);
  EXPECT_EQ(ParseByteSize("0.001k").value(), 1u);
  EXPECT_EQ(ParseByteSize("1.25000000000000000000000Ki").value(), 1280u)
      << "trailing zeros do not count as decimal places";
  for (const char* text : {"1.5", "0.1Ki", "0.0001k", "1.000000000000000001G"}) {
    absl::StatusOr<uint64_t> size = ParseByteSize(text);
    ASSERT_FALSE(size.ok()) << text << " read as " << *size;
    EXPECT_NE(size.status().message().find("not a whole number of bytes"), std::string::npos)
        << size.status();
  }
  absl::StatusOr<uint64_t> places = ParseByteSize("0.0000000000000000001T");
  ASSERT_FALSE(places.ok());
  EXPECT_NE(places.status().message().find("more than 18 decimal places"), std::string::npos)
      << places.status();
}

TEST(ByteSizeTest, TheLargestSizeAndOneMore) {
  EXPECT_EQ(ParseByteSize("18446744073709551615").value(), UINT64_MAX);
  EXPECT_EQ(ParseByteSize("16777215Ti").value(), ((uint64_t{1} << 24) - 1) << 40);
  for (const char* text : {"18446744073709551616", "16777216Ti", "18446744073710T",
                           "99999999999999999999999999999999999", "18446744073709551615.5Ki"}) {
    absl::StatusOr<uint64_t> size = ParseByteSize(text);
    ASSERT_FALSE(size.ok()) << text << " read as " << *size;
    EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(size.status().message().find("is too large: more than 18446744073709551615 bytes"),
              std::string::npos)
        << size.status();
  }
}

TEST(ByteSizeTest, MalformedSizesSayWhatIsWrong) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (const Case& c : {
           Case{"", "'' is not a byte size: it is empty"},
           Case{"   ", "is not a byte size: it is empty"},
           Case{"-1", "'-1' is not a byte size: it is negative"},
           Case{"-1GiB", "it is negative"},
           Case{"+1", "'+1' is not a byte size: it does not start with a number"},
           Case{"lots", "'lots' is not a byte size"},
           Case{"GiB", "it does not start with a number"},
           Case{".5G", "it does not start with a number"},
           Case{"1.G", "a decimal point needs digits after it"},
           Case{"5XB", "'5XB' has an unknown unit 'XB'"},
           Case{"1e9", "has an unknown unit 'e9'"},
           Case{"1 GiB", "has an unknown unit ' GiB'"},
           Case{"1Gib2", "has an unknown unit 'Gib2'"},
           Case{"1P", "has an unknown unit 'P'"},
           Case{"1iB", "has an unknown unit 'iB'"},
           Case{"1BB", "has an unknown unit 'BB'"},
           Case{"1,000", "has an unknown unit ',000'"},
       }) {
    absl::StatusOr<uint64_t> size = ParseByteSize(c.text);
    ASSERT_FALSE(size.ok()) << "'" << c.text << "' read as " << *size;
    EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(size.status().message().find(c.message), std::string::npos)
        << c.text << ": " << size.status();
  }
  // The unknown unit's message lists the units there are.
  EXPECT_NE(ParseByteSize("5XB").status().message().find("Ki, Mi, Gi, Ti (powers of 1024)"),
            std::string::npos);
}

}  // namespace
}  // namespace gpucompute
