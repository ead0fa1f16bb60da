// Tests of the .npy reader and writer (client/cpp/npy.h): byte-exact agreement with files
// NumPy wrote, round trips across dtypes, orders and shapes, and rejection of
// malformed and hostile files.
#include "client/cpp/npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "tests/support/test_util.h"

namespace gpucompute {
namespace {

// gmock's HasSubstr without the gmock dependency.
::testing::AssertionResult HasSubstr(absl::string_view text, absl::string_view part) {
  if (absl::StrContains(text, part)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

std::string Bytes(const char* data, size_t size) { return std::string(data, size); }

// Files written by NumPy 1.24 (np.save / np.lib.format.write_array), byte for byte.
// The header is padded with spaces so that the data starts at a multiple of 64.

// np.save(f, np.arange(3, dtype='<i4'))
std::string NumpyArange3Int32() {
  return Bytes("\x93NUMPY\x01\x00\x76\x00", 10) +
         "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }" + std::string(60, ' ') + "\n" +
         Bytes("\0\0\0\0\1\0\0\0\2\0\0\0", 12);
}

// np.save(f, np.asfortranarray(np.arange(6, dtype='<f8').reshape(2, 3)))
std::string NumpyFortran2x3Float64() {
  // Column-major: 0 3 1 4 2 5.
  const double values[] = {0, 3, 1, 4, 2, 5};
  return Bytes("\x93NUMPY\x01\x00\x76\x00", 10) +
         "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }" + std::string(59, ' ') +
         "\n" + Bytes(reinterpret_cast<const char*>(values), sizeof(values));
}

// np.save(f, np.array(True))
std::string NumpyScalarBool() {
  return Bytes("\x93NUMPY\x01\x00\x76\x00", 10) +
         "{'descr': '|b1', 'fortran_order': False, 'shape': (), }" + std::string(62, ' ') + "\n" +
         Bytes("\1", 1);
}

// np.save(f, np.zeros((0, 5), dtype='<f4'))
std::string NumpyEmpty0x5Float32() {
  return Bytes("\x93NUMPY\x01\x00\x76\x00", 10) +
         "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 5), }" + std::string(58, ' ') +
         "\n";
}

// np.lib.format.write_array_header_1_0 for shape (3,) * 15, '<f8', C order: NumPy's
// 20 spaces of room for the first axis to grow push this header from 128 to 192
// bytes.
std::string NumpyGrowthPaddedHeader() {
  return Bytes("\x93NUMPY\x01\x00\xb6\x00", 10) +
         "{'descr': '<f8', 'fortran_order': False, 'shape': (3, 3, 3, 3, 3, 3, 3, 3, 3, 3, "
         "3, 3, 3, 3, 3), }" +
         std::string(83, ' ') + "\n";
}

// np.lib.format.write_array(f, np.arange(3, dtype='<i4'), version=(2, 0)) and (3, 0).
std::string NumpyArange3Int32Version(char major) {
  return Bytes("\x93NUMPY", 6) + std::string(1, major) + Bytes("\x00\x74\x00\x00\x00", 5) +
         "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }" + std::string(58, ' ') + "\n" +
         Bytes("\0\0\0\0\1\0\0\0\2\0\0\0", 12);
}

TEST(NpyKnownGoodTest, FixturesHaveNumpysSizes) {
  EXPECT_EQ(NumpyArange3Int32().size(), 140u);
  EXPECT_EQ(NumpyFortran2x3Float64().size(), 176u);
  EXPECT_EQ(NumpyScalarBool().size(), 129u);
  EXPECT_EQ(NumpyEmpty0x5Float32().size(), 128u);
  EXPECT_EQ(NumpyGrowthPaddedHeader().size(), 192u);
  EXPECT_EQ(NumpyArange3Int32Version('\x02').size(), 140u);
}

TEST(NpyKnownGoodTest, EncodesHeadersByteForByteAsNumpy) {
  struct Case {
    NpyHeader header;
    std::string file;
    uint64_t data_bytes;
  };
  const Case cases[] = {
      {{DType::kInt32, {3}, false}, NumpyArange3Int32(), 12},
      {{DType::kFloat64, {2, 3}, true}, NumpyFortran2x3Float64(), 48},
      {{DType::kBool, {}, false}, NumpyScalarBool(), 1},
      {{DType::kFloat32, {0, 5}, false}, NumpyEmpty0x5Float32(), 0},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::string> encoded = EncodeNpyHeader(c.header);
    ASSERT_OK(encoded);
    EXPECT_EQ(*encoded, c.file.substr(0, c.file.size() - c.data_bytes));
  }
  absl::StatusOr<std::string> growth =
      EncodeNpyHeader({DType::kFloat64, std::vector<uint64_t>(15, 3), false});
  ASSERT_OK(growth);
  EXPECT_EQ(*growth, NumpyGrowthPaddedHeader());
}

TEST(NpyKnownGoodTest, ParsesNumpyFiles) {
  // ParseNpy returns a view into the file, which must outlive it.
  const std::string arange = NumpyArange3Int32();
  absl::StatusOr<NpyView> view = ParseNpy(arange);
  ASSERT_OK(view);
  EXPECT_EQ(view->parsed.header, (NpyHeader{DType::kInt32, {3}, false}));
  EXPECT_EQ(view->parsed.major_version, 1);
  EXPECT_EQ(view->parsed.data_offset, 128u);
  EXPECT_EQ(view->parsed.data_bytes, 12u);
  int32_t values[3];
  ASSERT_EQ(view->data.size(), sizeof(values));
  std::memcpy(values, view->data.data(), sizeof(values));
  EXPECT_EQ(values[0], 0);
  EXPECT_EQ(values[1], 1);
  EXPECT_EQ(values[2], 2);

  const std::string fortran = NumpyFortran2x3Float64();
  view = ParseNpy(fortran);
  ASSERT_OK(view);
  EXPECT_EQ(view->parsed.header, (NpyHeader{DType::kFloat64, {2, 3}, true}));
  double doubles[6];
  ASSERT_EQ(view->data.size(), sizeof(doubles));
  std::memcpy(doubles, view->data.data(), sizeof(doubles));
  EXPECT_EQ(doubles[1], 3.0);  // element [1, 0] in column-major order

  const std::string scalar = NumpyScalarBool();
  view = ParseNpy(scalar);
  ASSERT_OK(view);
  EXPECT_EQ(view->parsed.header, (NpyHeader{DType::kBool, {}, false}));
  EXPECT_EQ(view->data, std::string(1, '\1'));

  const std::string empty = NumpyEmpty0x5Float32();
  view = ParseNpy(empty);
  ASSERT_OK(view);
  EXPECT_EQ(view->parsed.header, (NpyHeader{DType::kFloat32, {0, 5}, false}));
  EXPECT_TRUE(view->data.empty());
}

TEST(NpyKnownGoodTest, ReadsVersion2And3Headers) {
  for (char major : {'\x02', '\x03'}) {
    const std::string file = NumpyArange3Int32Version(major);
    absl::StatusOr<NpyView> view = ParseNpy(file);
    ASSERT_OK(view);
    EXPECT_EQ(view->parsed.major_version, major);
    EXPECT_EQ(view->parsed.data_offset, 128u);
    EXPECT_EQ(view->parsed.header, (NpyHeader{DType::kInt32, {3}, false}));
    EXPECT_EQ(view->data, Bytes("\0\0\0\0\1\0\0\0\2\0\0\0", 12));
  }
}

// A header written by hand rather than by NumPy: other quotes and spacing, Python 2's
// long-integer suffix, keys in another order.
TEST(NpyParseTest, AcceptsEquivalentPythonLiterals) {
  const std::string dict = "{ \"shape\" : ( 2L , 3 , ) ,\n 'fortran_order':True,'descr':\"<i8\"}";
  const uint16_t length = static_cast<uint16_t>(dict.size() + 1);
  std::string file = Bytes("\x93NUMPY\x01\x00", 8);
  file.push_back(static_cast<char>(length & 0xff));
  file.push_back(static_cast<char>(length >> 8));
  file += dict + "\n" + std::string(48, 'x');
  absl::StatusOr<NpyView> view = ParseNpy(file);
  ASSERT_OK(view);
  EXPECT_EQ(view->parsed.header, (NpyHeader{DType::kInt64, {2, 3}, true}));
}

// ---------------------------------------------------------------------------
// Round trips

std::filesystem::path TempPath(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         ("npy_test_" + std::to_string(::getpid()) + "_" + name);
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Distinct element values of T, as stored bytes.
template <typename T>
std::string ElementBytes(uint64_t count) {
  std::string bytes;
  for (uint64_t i = 0; i < count; ++i) {
    T value;
    if constexpr (std::is_same_v<T, bool>) {
      value = (i % 3) == 1;
    } else {
      value = static_cast<T>(static_cast<int64_t>(i) * 7 - 11);
    }
    if constexpr (std::is_same_v<T, bool>) {
      bytes.push_back(value ? '\1' : '\0');
    } else {
      bytes.append(reinterpret_cast<const char*>(&value), sizeof(T));
    }
  }
  return bytes;
}

const std::vector<std::vector<uint64_t>>& TestShapes() {
  static const auto* shapes = new std::vector<std::vector<uint64_t>>{
      {}, {0}, {1}, {5}, {2, 3}, {3, 0}, {0, 0}, {2, 3, 4}, {1, 1, 1, 1, 7}, {4, 1, 3},
  };
  return *shapes;
}

template <typename T>
class NpyRoundTripTest : public ::testing::Test {};

using ElementTypes = ::testing::Types<bool, int32_t, int64_t, float, double>;
TYPED_TEST_SUITE(NpyRoundTripTest, ElementTypes);

TYPED_TEST(NpyRoundTripTest, InMemory) {
  for (const std::vector<uint64_t>& shape : TestShapes()) {
    for (bool fortran_order : {false, true}) {
      const NpyHeader header{DTypeOf<TypeParam>::value, shape, fortran_order};
      SCOPED_TRACE(::testing::Message()
                   << "shape rank " << shape.size() << " fortran " << fortran_order);
      absl::StatusOr<uint64_t> count = NpyElementCount(header);
      ASSERT_OK(count);
      const std::string data = ElementBytes<TypeParam>(*count);
      absl::StatusOr<std::string> encoded = EncodeNpyHeader(header);
      ASSERT_OK(encoded);
      EXPECT_EQ(encoded->size() % 64, 0u);
      EXPECT_EQ(encoded->back(), '\n');

      const std::string file = *encoded + data;
      absl::StatusOr<NpyView> view = ParseNpy(file);
      ASSERT_OK(view);
      EXPECT_EQ(view->parsed.header, header);
      EXPECT_EQ(view->parsed.major_version, 1);
      EXPECT_EQ(view->parsed.data_offset, encoded->size());
      EXPECT_EQ(view->parsed.data_bytes, data.size());
      EXPECT_EQ(view->data, data);
    }
  }
}

TYPED_TEST(NpyRoundTripTest, ThroughFilesInSmallPieces) {
  const std::filesystem::path path = TempPath("roundtrip.npy");
  for (const std::vector<uint64_t>& shape : TestShapes()) {
    for (bool fortran_order : {false, true}) {
      const NpyHeader header{DTypeOf<TypeParam>::value, shape, fortran_order};
      const std::string data = ElementBytes<TypeParam>(*NpyElementCount(header));

      absl::StatusOr<NpyWriter> writer = NpyWriter::Create(path.string(), header);
      ASSERT_OK(writer);
      for (size_t i = 0; i < data.size(); i += 7) {
        ASSERT_OK(writer->Write(std::string_view(data).substr(i, 7)));
      }
      ASSERT_OK(writer->Close());
      EXPECT_EQ(ReadFile(path), *EncodeNpyHeader(header) + data);

      absl::StatusOr<NpyReader> reader = NpyReader::Open(path.string());
      ASSERT_OK(reader);
      EXPECT_EQ(reader->header(), header);
      std::string read_back;
      std::byte piece[5];
      while (true) {
        absl::StatusOr<size_t> n = reader->Read(piece);
        ASSERT_OK(n);
        if (*n == 0) break;
        read_back.append(reinterpret_cast<const char*>(piece), *n);
      }
      EXPECT_EQ(read_back, data);
      EXPECT_EQ(reader->bytes_read(), data.size());
    }
  }
  std::filesystem::remove(path);
}

TEST(NpyFileTest, ReaderStreamsANumpyFile) {
  const std::filesystem::path path = TempPath("numpy.npy");
  WriteFile(path, NumpyFortran2x3Float64());
  absl::StatusOr<NpyReader> reader = NpyReader::Open(path.string());
  ASSERT_OK(reader);
  EXPECT_EQ(reader->header(), (NpyHeader{DType::kFloat64, {2, 3}, true}));
  EXPECT_EQ(reader->data_bytes(), 48u);
  std::byte all[64];
  absl::StatusOr<size_t> n = reader->Read(all);
  ASSERT_OK(n);
  EXPECT_EQ(*n, 48u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(all), 48),
            NumpyFortran2x3Float64().substr(128));
  std::filesystem::remove(path);
}

TEST(NpyFileTest, ReaderRejectsMissingAndMalformedFiles) {
  absl::StatusOr<NpyReader> missing = NpyReader::Open(TempPath("does_not_exist.npy").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);

  const std::filesystem::path path = TempPath("short.npy");
  const std::string good = NumpyArange3Int32();
  // Every proper prefix is rejected: in the preamble, the header or the data.
  for (size_t size = 0; size < good.size(); ++size) {
    WriteFile(path, good.substr(0, size));
    absl::StatusOr<NpyReader> reader = NpyReader::Open(path.string());
    ASSERT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument) << size;
    EXPECT_TRUE(HasSubstr(reader.status().message(), path.string()));
  }
  WriteFile(path, good + "extra");
  absl::StatusOr<NpyReader> long_file = NpyReader::Open(path.string());
  EXPECT_EQ(long_file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSubstr(long_file.status().message(), "has 17 data bytes"));
  std::filesystem::remove(path);
}

TEST(NpyFileTest, WriterChecksTheDeclaredSize) {
  const std::filesystem::path path = TempPath("writer.npy");
  const NpyHeader header{DType::kInt32, {2}, false};
  absl::StatusOr<NpyWriter> writer = NpyWriter::Create(path.string(), header);
  ASSERT_OK(writer);
  EXPECT_EQ(writer->Write(std::string(12, 'a')).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(writer->bytes_written(), 0u);
  ASSERT_OK(writer->Write(std::string(4, 'a')));
  EXPECT_EQ(writer->Close().code(), absl::StatusCode::kFailedPrecondition);

  absl::StatusOr<NpyWriter> bad_dir =
      NpyWriter::Create((TempPath("no_such_dir") / "x.npy").string(), header);
  EXPECT_EQ(bad_dir.status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove(path);
}

// ---------------------------------------------------------------------------
// Malformed and hostile input

// A version 1.0 file with `dict` as its header (newline added) and `data` after it.
std::string FileWithHeader(const std::string& dict, const std::string& data = "") {
  const size_t length = dict.size() + 1;
  std::string file = Bytes("\x93NUMPY\x01\x00", 8);
  file.push_back(static_cast<char>(length & 0xff));
  file.push_back(static_cast<char>((length >> 8) & 0xff));
  return file + dict + "\n" + data;
}

std::string Dict(const std::string& descr, const std::string& fortran_order,
                 const std::string& shape) {
  return "{'descr': " + descr + ", 'fortran_order': " + fortran_order + ", 'shape': " + shape +
         ", }";
}

struct MalformedCase {
  const char* name;
  std::string file;
  const char* message;
};

std::vector<MalformedCase> MalformedCases() {
  const std::string good_dict = Dict("'<i4'", "False", "(3,)");
  const std::string data12(12, '\0');
  std::string huge_v2 = Bytes("\x93NUMPY\x02\x00\xff\xff\xff\xff", 12) + good_dict;
  std::string v1_max_length = Bytes("\x93NUMPY\x01\x00\xff\xff", 10) + good_dict;
  return {
      {"empty", "", "shorter than the 8-byte preamble"},
      {"truncated_magic", Bytes("\x93NUM", 4), "shorter than the 8-byte preamble"},
      {"bad_magic", Bytes("\x93NUMPZ\x01\x00\x10\x00", 10) + good_dict, "not an .npy file"},
      {"text_file", "hello, world, this is text", "not an .npy file"},
      {"version_4", Bytes("\x93NUMPY\x04\x00\x10\x00", 10), "format version 4.0"},
      {"version_1_1", Bytes("\x93NUMPY\x01\x01\x10\x00", 10), "format version 1.1"},
      {"truncated_length", Bytes("\x93NUMPY\x02\x00\x10\x00", 10), "header length field"},
      {"huge_header_length", huge_v2, "exceeds the limit"},
      {"header_beyond_file", v1_max_length, "truncated .npy file"},
      {"empty_header", FileWithHeader(""), "expected '{'"},
      {"not_a_dict", FileWithHeader("['<i4', False, (3,)]"), "expected '{'"},
      {"unclosed_dict", FileWithHeader("{'descr': '<i4', 'fortran_order': False"),
       "expected ',' or '}'"},
      {"misquoted_key", FileWithHeader("{'descr: '<i4'}"), "expected ':'"},
      {"string_runs_off", Bytes("\x93NUMPY\x01\x00\x07\x00", 10) + "{'descr",
       "unterminated string"},
      {"newline_in_string", FileWithHeader("{'descr"), "unexpected character in a string"},
      {"unquoted_key", FileWithHeader("{descr: '<i4'}"), "expected a quoted key"},
      {"missing_shape", FileWithHeader("{'descr': '<i4', 'fortran_order': False}"),
       "missing key 'shape'"},
      {"missing_descr", FileWithHeader("{'fortran_order': False, 'shape': (3,)}"),
       "missing key 'descr'"},
      {"extra_key", FileWithHeader(Dict("'<i4'", "False", "(3,), 'extra': 1"), data12),
       "unexpected key 'extra'"},
      {"duplicate_key", FileWithHeader(Dict("'<i4'", "False", "(3,), 'shape': (3,)"), data12),
       "duplicate key 'shape'"},
      {"trailing_text", FileWithHeader(good_dict + " junk", data12),
       "unexpected text after the dictionary"},
      {"escape_in_string", FileWithHeader(Dict("'<i\\x34'", "False", "(3,)"), data12),
       "escape sequences"},
      {"non_ascii",
       FileWithHeader(Dict("'<\xc3\xa9"
                           "4'",
                           "False", "(3,)"),
                      data12),
       "unexpected character"},
      {"shape_not_tuple", FileWithHeader(Dict("'<i4'", "False", "(3)"), data12),
       "shape must be a tuple"},
      {"shape_list", FileWithHeader(Dict("'<i4'", "False", "[3]"), data12),
       "shape must be a tuple"},
      {"shape_negative", FileWithHeader(Dict("'<i4'", "False", "(-3,)"), data12),
       "negative dimension"},
      {"shape_float", FileWithHeader(Dict("'<i4'", "False", "(3.0,)"), data12),
       "expected ',' or ')'"},
      {"shape_empty_element", FileWithHeader(Dict("'<i4'", "False", "(,)"), data12),
       "expected a dimension"},
      {"shape_leading_zero", FileWithHeader(Dict("'<i4'", "False", "(03,)"), data12),
       "leading zero"},
      {"shape_overflow", FileWithHeader(Dict("'<i4'", "False", "(99999999999999999999,)")),
       "does not fit in 64 bits"},
      {"too_many_elements", FileWithHeader(Dict("'<i4'", "False", "(4294967296, 4294967296, 2)")),
       "more than 2^64 elements"},
      {"too_many_bytes", FileWithHeader(Dict("'<f8'", "False", "(4611686018427387904,)")),
       "needs more than 2^64 bytes"},
      {"too_many_dimensions",
       FileWithHeader(Dict(
                          "'<i4'", "False",
                          "(" +
                              [] {
                                std::string s;
                                for (int i = 0; i < 65; ++i) s += "1, ";
                                return s;
                              }() +
                              ")"),
                      "\0\0\0\0"),
       "more than 64 dimensions"},
      {"fortran_order_lowercase", FileWithHeader(Dict("'<i4'", "true", "(3,)"), data12),
       "fortran_order must be True or False"},
      {"fortran_order_int", FileWithHeader(Dict("'<i4'", "1", "(3,)"), data12),
       "fortran_order must be True or False"},
      {"fortran_order_prefix", FileWithHeader(Dict("'<i4'", "Truest", "(3,)"), data12),
       "fortran_order must be True or False"},
      {"descr_unsigned", FileWithHeader(Dict("'|u1'", "False", "(3,)"), "abc"),
       "unsupported .npy dtype '|u1'"},
      {"descr_half", FileWithHeader(Dict("'<f2'", "False", "(3,)"), "abcdef"),
       "unsupported .npy dtype '<f2'"},
      {"descr_complex", FileWithHeader(Dict("'<c16'", "False", "(1,)")),
       "unsupported .npy dtype '<c16'"},
      {"descr_big_endian", FileWithHeader(Dict("'>f8'", "False", "(1,)"), std::string(8, '\0')),
       "big-endian"},
      {"descr_structured",
       FileWithHeader(Dict("[('a', '<i4')]", "False", "(1,)"), std::string(4, '\0')),
       "structured arrays"},
      {"descr_not_string", FileWithHeader(Dict("4", "False", "(1,)")), "expected a quoted descr"},
      {"data_short", FileWithHeader(Dict("'<i4'", "False", "(3,)"), std::string(11, '\0')),
       "has 11 data bytes but shape (3,) of int32 needs 12"},
      {"data_long", FileWithHeader(Dict("'<i4'", "False", "(3,)"), std::string(13, '\0')),
       "has 13 data bytes"},
      {"data_missing_for_scalar", FileWithHeader(Dict("'<f8'", "False", "()")),
       "has 0 data bytes but shape () of float64 needs 8"},
  };
}

class NpyMalformedTest : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(NpyMalformedTest, IsRejectedWithInvalidArgument) {
  const MalformedCase& c = GetParam();
  absl::StatusOr<NpyView> view = ParseNpy(c.file);
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument) << view.status();
  EXPECT_TRUE(HasSubstr(view.status().message(), c.message));
}

TEST_P(NpyMalformedTest, IsRejectedFromAFile) {
  const MalformedCase& c = GetParam();
  const std::filesystem::path path = TempPath(std::string(c.name) + ".npy");
  WriteFile(path, c.file);
  absl::StatusOr<NpyReader> reader = NpyReader::Open(path.string());
  std::filesystem::remove(path);
  ASSERT_FALSE(reader.ok());
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument) << reader.status();
  EXPECT_TRUE(HasSubstr(reader.status().message(), c.message));
}

INSTANTIATE_TEST_SUITE_P(All, NpyMalformedTest, ::testing::ValuesIn(MalformedCases()),
                         [](const ::testing::TestParamInfo<MalformedCase>& info) {
                           return std::string(info.param.name);
                         });

// Random corruption of a valid file never crashes: the result is either a valid
// parse or InvalidArgument.
TEST(NpyCorruptionTest, SurvivesRandomCorruption) {
  const std::string good = NumpyFortran2x3Float64();
  std::mt19937 rng(12345);
  int rejected = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string file = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      file[rng() % 128] = static_cast<char>(rng() % 256);
    }
    if (rng() % 4 == 0) file.resize(rng() % file.size());
    absl::StatusOr<NpyView> view = ParseNpy(file);
    if (view.ok()) {
      EXPECT_EQ(view->data.size(), view->parsed.data_bytes);
    } else {
      ASSERT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument) << view.status();
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
}

// ---------------------------------------------------------------------------
// Dtype conversions

TEST(NpyDTypeTest, DescrsAndProtoEnumsRoundTrip) {
  const struct {
    DType dtype;
    const char* descr;
    v1::DType proto;
    const char* name;
  } cases[] = {
      {DType::kBool, "|b1", v1::DTYPE_BOOL, "bool"},
      {DType::kInt32, "<i4", v1::DTYPE_INT32, "int32"},
      {DType::kInt64, "<i8", v1::DTYPE_INT64, "int64"},
      {DType::kFloat32, "<f4", v1::DTYPE_FLOAT32, "float32"},
      {DType::kFloat64, "<f8", v1::DTYPE_FLOAT64, "float64"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(NpyDescr(c.dtype), c.descr);
    EXPECT_EQ(*DTypeFromNpyDescr(c.descr), c.dtype);
    EXPECT_EQ(ToProtoDType(c.dtype), c.proto);
    EXPECT_EQ(*FromProtoDType(c.proto), c.dtype);
    EXPECT_EQ(*DTypeFromName(c.name), c.dtype);
  }
  EXPECT_EQ(FromProtoDType(v1::DTYPE_UNSPECIFIED).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromProtoDType(static_cast<v1::DType>(99)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DTypeFromName("float16").status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<DType> big = DTypeFromNpyDescr(">i4");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(HasSubstr(big.status().message(), "'>i4'"));
}

TEST(NpyEncodeTest, RejectsUnrepresentableHeaders) {
  EXPECT_EQ(EncodeNpyHeader({DType::kFloat64, std::vector<uint64_t>(65, 1), false}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeNpyHeader({DType::kFloat64, {uint64_t{1} << 62}, false}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A zero dimension makes any other extent fine: the array is empty.
  EXPECT_OK(EncodeNpyHeader({DType::kFloat64, {0, ~uint64_t{0}}, false}));
}

}  // namespace
}  // namespace gpucompute
