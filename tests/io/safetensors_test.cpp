#include "posembed/io/safetensors.h"

#include <filesystem>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "io/io_test_util.h"
#include "posembed/core/error.h"

namespace posembed::io {
namespace {

using test::bytes_of;
using test::pack;

SafetensorsFile parse(const std::vector<std::byte>& bytes) {
  return SafetensorsFile::from_bytes(bytes, "test");
}

// Expects parse() to throw posembed::Error whose message contains `needle`.
void expect_rejected(const std::vector<std::byte>& bytes, const std::string& needle) {
  try {
    parse(bytes);
    ADD_FAILURE() << "accepted a file that should fail with '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

TEST(Safetensors, ReadsHandPackedFileWithKeysInAnyOrder) {
  // Data order: b (I64 scalar, 8 bytes), e (F32 [0, 3], empty), a (F32 [2, 2]).
  std::vector<std::byte> data = bytes_of(std::vector<std::int64_t>{-7});
  const auto a = bytes_of(std::vector<float>{1.5f, -2.0f, 0.25f, 3e38f});
  data.insert(data.end(), a.begin(), a.end());
  const std::string header =
      R"({"a":{"shape":[2,2],"data_offsets":[8,24],"dtype":"F32"},)"
      R"("e":{"dtype":"F32","shape":[0,3],"data_offsets":[8,8]},)"
      R"("__metadata__":{"format":"pt","k":"v"},)"
      R"("b":{"data_offsets":[0,8],"dtype":"I64","shape":[],"extra":"ignored"}}   )";
  const auto file = parse(pack(header, data));
  ASSERT_EQ(file.tensors().size(), 3u);
  EXPECT_EQ(file.tensors()[0].name, "b");  // file order = data order
  EXPECT_EQ(file.tensors()[1].name, "e");
  EXPECT_EQ(file.tensors()[2].name, "a");
  const TensorInfo* ta = file.find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->dtype, DType::F32);
  EXPECT_EQ(ta->shape, (std::vector<std::int64_t>{2, 2}));
  EXPECT_EQ(ta->numel(), 4);
  EXPECT_EQ(file.to_f32(*ta), (std::vector<float>{1.5f, -2.0f, 0.25f, 3e38f}));
  const TensorInfo* tb = file.find("b");
  ASSERT_NE(tb, nullptr);
  EXPECT_TRUE(tb->shape.empty());
  EXPECT_EQ(tb->numel(), 1);
  EXPECT_EQ(file.to_f64(*tb), (std::vector<double>{-7.0}));
  EXPECT_EQ(file.find("e")->numel(), 0);
  EXPECT_TRUE(file.to_f32(*file.find("e")).empty());
  EXPECT_EQ(file.find("missing"), nullptr);
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"k", "v"}}));
}

TEST(Safetensors, EmptyFileWithOnlyHeader) {
  const auto file = parse(pack("{}      "));
  EXPECT_TRUE(file.tensors().empty());
  EXPECT_TRUE(file.metadata().empty());
}

// Published bit patterns (IEEE 754 binary16, bfloat16, OCP FP8).
TEST(Safetensors, DecodesKnownBitPatterns) {
  const auto f16 = convert_to_f64(DType::F16, bytes_of(std::vector<std::uint16_t>{
                                                  0x3C00, 0xC000, 0x7BFF, 0x0001, 0x0400, 0x7C00, 0x3555, 0x8000}));
  EXPECT_EQ(f16[0], 1.0);
  EXPECT_EQ(f16[1], -2.0);
  EXPECT_EQ(f16[2], 65504.0);
  EXPECT_EQ(f16[3], std::ldexp(1.0, -24));
  EXPECT_EQ(f16[4], std::ldexp(1.0, -14));
  EXPECT_TRUE(std::isinf(f16[5]));
  EXPECT_EQ(f16[6], 0.333251953125);
  EXPECT_TRUE(f16[7] == 0.0 && std::signbit(f16[7]));
  const auto bf16 = convert_to_f64(DType::BF16, bytes_of(std::vector<std::uint16_t>{0x3F80, 0xC049, 0x0001}));
  EXPECT_EQ(bf16[0], 1.0);
  EXPECT_EQ(bf16[1], -3.140625);
  EXPECT_EQ(bf16[2], std::ldexp(1.0, -133));
  const auto e4m3 = convert_to_f64(DType::F8_E4M3, bytes_of(std::vector<std::uint8_t>{0x7E, 0x01, 0x38, 0x7F}));
  EXPECT_EQ(e4m3[0], 448.0);
  EXPECT_EQ(e4m3[1], std::ldexp(1.0, -9));
  EXPECT_EQ(e4m3[2], 1.0);
  EXPECT_TRUE(std::isnan(e4m3[3]));
  const auto e5m2 = convert_to_f64(DType::F8_E5M2, bytes_of(std::vector<std::uint8_t>{0x7B, 0x01, 0x3C, 0x7C}));
  EXPECT_EQ(e5m2[0], 57344.0);
  EXPECT_EQ(e5m2[1], std::ldexp(1.0, -16));
  EXPECT_EQ(e5m2[2], 1.0);
  EXPECT_TRUE(std::isinf(e5m2[3]));
  const auto ints = convert_to_f32(DType::I8, bytes_of(std::vector<std::int8_t>{-128, 127}));
  EXPECT_EQ(ints, (std::vector<float>{-128.0f, 127.0f}));
  const auto u64 = convert_to_f64(DType::U64, bytes_of(std::vector<std::uint64_t>{1ull << 53}));
  EXPECT_EQ(u64[0], 9007199254740992.0);
}

// Every non-NaN code of a 8/16-bit float survives decode -> encode unchanged.
template <class Code>
void expect_codes_round_trip(DType dtype) {
  const std::size_t count = std::size_t{1} << (8 * sizeof(Code));
  std::vector<Code> codes(count);
  for (std::size_t i = 0; i < count; ++i) codes[i] = static_cast<Code>(i);
  const auto values = convert_to_f32(dtype, bytes_of(codes));
  const auto encoded = convert_from_f32(dtype, values);
  const auto back = convert_to_f32(dtype, encoded);
  std::size_t checked = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (std::isnan(values[i])) {
      EXPECT_TRUE(std::isnan(back[i])) << dtype_name(dtype) << " NaN code " << i;
      continue;
    }
    Code got;
    std::memcpy(&got, encoded.data() + i * sizeof(Code), sizeof(Code));
    ASSERT_EQ(got, codes[i]) << dtype_name(dtype) << " code " << i << " value " << values[i];
    ++checked;
  }
  EXPECT_GT(checked, count * 9 / 10);
}

TEST(Safetensors, SmallFloatCodesRoundTripExhaustively) {
  expect_codes_round_trip<std::uint16_t>(DType::F16);
  expect_codes_round_trip<std::uint16_t>(DType::BF16);
  expect_codes_round_trip<std::uint8_t>(DType::F8_E4M3);
  expect_codes_round_trip<std::uint8_t>(DType::F8_E5M2);
}

// binary16's value from its fields, in double (an independent decoder).
double half_value(std::uint16_t h) {
  const int exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  const double magnitude = exponent == 0    ? std::ldexp(mantissa, -24)
                           : exponent == 31 ? (mantissa ? std::nan("") : HUGE_VAL)
                                            : std::ldexp(1024 + mantissa, exponent - 25);
  return (h & 0x8000) ? -magnitude : magnitude;
}

// Decoding into a caller's buffer (load_layer's tables): every 16-bit code
// of F16 against its value from the fields and of BF16 against the float of
// its bits shifted up (a NaN as a NaN); F32's bits copied as they are (NaN
// payloads, -0); F64 and 64-bit integers rounded once; and a buffer of the wrong size refused
// before anything is written.
TEST(Safetensors, DecodesIntoAGivenBuffer) {
  std::vector<std::uint16_t> codes(1 << 16);
  for (std::size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<std::uint16_t>(i);
  std::vector<float> out(codes.size());
  for (const DType dtype : {DType::F16, DType::BF16}) {
    convert_to_f32(dtype, bytes_of(codes), out);
    for (std::size_t i = 0; i < codes.size(); ++i) {
      const double want =
          dtype == DType::F16
              ? half_value(codes[i])
              : static_cast<double>(std::bit_cast<float>(std::uint32_t{codes[i]} << 16));
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(out[i])) << dtype_name(dtype) << " code " << i;
        continue;
      }
      ASSERT_EQ(static_cast<double>(out[i]), want) << dtype_name(dtype) << " code " << i;
      ASSERT_EQ(std::signbit(out[i]), std::signbit(want)) << dtype_name(dtype) << " code " << i;
    }
  }
  const std::vector<std::uint32_t> f32_bits{0x7FC01234u, 0xFF800001u, 0x80000000u, 0x00000001u,
                                            0x3F800000u};
  std::vector<float> f32_out(f32_bits.size());
  convert_to_f32(DType::F32, bytes_of(f32_bits), f32_out);
  for (std::size_t i = 0; i < f32_bits.size(); ++i) {
    EXPECT_EQ(std::bit_cast<std::uint32_t>(f32_out[i]), f32_bits[i]) << i;
  }
  const std::vector<double> f64{1.0 + 0x1p-24, 1.0 + 0x1.8p-24, -0x1p-149 / 2};
  std::vector<float> f64_out(f64.size());
  convert_to_f32(DType::F64, bytes_of(f64), f64_out);
  for (std::size_t i = 0; i < f64.size(); ++i)
    EXPECT_EQ(f64_out[i], static_cast<float>(f64[i])) << i;
  // 2^54 + 2^30 + 1 rounds up to 2^54 + 2^31 at once; through double it
  // would tie at 2^54 + 2^30 and go down to 2^54.
  const std::int64_t wide = (std::int64_t{1} << 54) + (std::int64_t{1} << 30) + 1;
  std::vector<float> int_out(2);
  convert_to_f32(DType::I64, bytes_of(std::vector<std::int64_t>{wide, -wide}), int_out);
  EXPECT_EQ(int_out[0], 0x1p54f + 0x1p31f);
  EXPECT_EQ(int_out[1], -(0x1p54f + 0x1p31f));
  convert_to_f32(DType::U64,
                 bytes_of(std::vector<std::uint64_t>{static_cast<std::uint64_t>(wide), 0}),
                 int_out);
  EXPECT_EQ(int_out[0], 0x1p54f + 0x1p31f);

  std::vector<float> short_out(4, 7.0f);
  EXPECT_THROW(
      {
        try {
          convert_to_f32(DType::BF16, bytes_of(std::vector<std::uint16_t>{1, 2, 3, 4, 5}),
                         short_out);
        } catch (const Error& e) {
          EXPECT_STREQ(e.what(),
                       "5 BF16 elements go into 4 values; give as many values as elements");
          throw;
        }
      },
      Error);
  EXPECT_THROW(convert_to_f32(DType::F64, bytes_of(f64), short_out), Error);
  EXPECT_EQ(short_out, std::vector<float>(4, 7.0f));  // untouched
}

// Encoding picks the nearest representable value, ties to even: checked in
// double against every code's decoded value. Ties are the exact midpoints
// between neighbouring positive codes (representable in fp32 for these widths).
TEST(Safetensors, EncodingRoundsToNearestEven) {
  for (DType dtype : {DType::F16, DType::BF16, DType::F8_E4M3, DType::F8_E5M2}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const std::size_t count = std::size_t{1} << (dtype_size(dtype) * 8);
    std::vector<std::byte> codes(count * dtype_size(dtype));
    for (std::size_t i = 0; i < count; ++i) {
      const auto code = static_cast<std::uint16_t>(i);
      std::memcpy(codes.data() + i * dtype_size(dtype), &code, dtype_size(dtype));
    }
    const auto table = convert_to_f64(dtype, codes);
    // Positive codes 0 .. last finite one increase with the code.
    std::size_t last = 0;
    while (last + 1 < count / 2 && std::isfinite(table[last + 1])) ++last;
    std::vector<float> ties;
    std::vector<std::size_t> want;
    for (std::size_t i = 0; i < last; ++i) {
      const double mid = (table[i] + table[i + 1]) / 2;
      ASSERT_EQ(static_cast<double>(static_cast<float>(mid)), mid);
      ties.push_back(static_cast<float>(mid));
      want.push_back(i % 2 == 0 ? i : i + 1);
    }
    const auto tie_codes = convert_from_f32(dtype, ties);
    for (std::size_t k = 0; k < ties.size(); ++k) {
      std::uint16_t got = 0;
      std::memcpy(&got, tie_codes.data() + k * dtype_size(dtype), dtype_size(dtype));
      ASSERT_EQ(got, want[k]) << "tie " << ties[k];
    }
    // Random values, positive and negative, against a nearest search.
    std::vector<float> probes;
    std::uint64_t state = 12345;
    for (int k = 0; k < 3000; ++k) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const double u = static_cast<double>(state >> 11) * 0x1.0p-53;
      probes.push_back(static_cast<float>((u * 2 - 1) * table[last]));
      probes.push_back(static_cast<float>((u * 2 - 1) * std::min(std::ldexp(table[1], k % 24), table[last])));
    }
    const auto decoded = convert_to_f64(dtype, convert_from_f32(dtype, probes));
    for (std::size_t p = 0; p < probes.size(); ++p) {
      const double x = probes[p];
      double best_err = INFINITY;
      for (double v : table) {
        if (std::isfinite(v)) best_err = std::min(best_err, std::abs(v - x));
      }
      ASSERT_EQ(std::abs(decoded[p] - x), best_err) << x << " encoded as " << decoded[p];
    }
  }
}

TEST(Safetensors, WriterRoundTripsEveryDTypeAndOddShapes) {
  test::TempDir dir;
  std::vector<std::vector<std::byte>> buffers;
  std::vector<TensorToWrite> tensors;
  const std::vector<std::vector<std::int64_t>> shapes = {{}, {0}, {3, 0, 2}, {1}, {5, 3}, {2, 1, 3}};
  for (DType dtype : kAllDTypes) {
    for (std::size_t s = 0; s < shapes.size(); ++s) {
      std::int64_t n = 1;
      for (auto d : shapes[s]) n *= d;
      std::vector<std::byte> data(static_cast<std::size_t>(n) * dtype_size(dtype));
      for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>((i * 37 + s) & 0x3F);
      buffers.push_back(std::move(data));
      tensors.push_back({std::string(dtype_name(dtype)) + "/" + std::to_string(s), dtype, shapes[s], {}});
    }
  }
  for (std::size_t i = 0; i < tensors.size(); ++i) tensors[i].data = buffers[i];
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"unicode", "位置 ✓"}, {"", "empty key"}};
  save_safetensors(dir / "all.safetensors", tensors, meta);
  const auto bytes = test::read_file(dir / "all.safetensors");
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u) << "header padded to a multiple of 8";
  const auto file = SafetensorsFile::open(dir / "all.safetensors");
  EXPECT_EQ(file.metadata(), meta);
  ASSERT_EQ(file.tensors().size(), tensors.size());
  for (const auto& t : tensors) {
    const TensorInfo* got = file.find(t.name);
    ASSERT_NE(got, nullptr) << t.name;
    EXPECT_EQ(got->dtype, t.dtype);
    EXPECT_EQ(got->shape, t.shape);
    ASSERT_EQ(got->data.size(), t.data.size());
    EXPECT_TRUE(std::equal(got->data.begin(), got->data.end(), t.data.begin())) << t.name;
  }
  EXPECT_EQ(dir.entries(), 1u) << "no temporary file left behind";
}

TEST(Safetensors, WriterRejectsBadInputBeforeWriting) {
  test::TempDir dir;
  const std::vector<float> v = {1, 2, 3};
  const auto b = std::as_bytes(std::span<const float>(v));
  auto rejects = [&](std::vector<TensorToWrite> t, const std::string& needle) {
    try {
      save_safetensors(dir / "x.safetensors", t, {});
      ADD_FAILURE() << "accepted; expected " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_EQ(dir.entries(), 0u) << "nothing written for " << needle;
  };
  rejects({{"a", DType::F32, {2}, b}}, "needs 8 bytes");
  rejects({{"a", DType::F32, {3}, b}, {"a", DType::F32, {3}, b}}, "appears twice");
  rejects({{"__metadata__", DType::F32, {3}, b}}, "reserved");
  rejects({{"a", DType::F32, {-3}, b}}, "negative");
  rejects({{"a", DType::F32, {1ll << 62, 1ll << 62}, b}}, "2^64");
  rejects({{"bad\xff", DType::F32, {3}, b}}, "UTF-8");
  // A directory as the output: named, with a file to give instead, and nothing left in it.
  std::filesystem::create_directory(dir / "out");
  try {
    save_safetensors(dir / "out", {{{"a", DType::F32, {3}, b}}}, {});
    ADD_FAILURE() << "saved to a directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("it is a directory; name a file, such as"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir / "out"));
}

struct Malformed {
  std::string label;
  std::vector<std::byte> bytes;
  std::string needle;
};

std::vector<Malformed> malformed_cases() {
  const std::vector<std::byte> four(4, std::byte{0});
  const std::vector<std::byte> eight(8, std::byte{0});
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  std::vector<std::byte> truncated = pack("{" + ok_entry + "}", four);
  truncated.pop_back();
  // One case a line:
  // clang-format off
  return {
      {"empty file", {}, "shorter than the 8-byte"},
      {"seven bytes", std::vector<std::byte>(7), "shorter than the 8-byte"},
      {"header past end", pack("{}", {}, 1000), "runs past the end"},
      {"header above 100 MB", pack("{}", {}, 100'000'001), "exceeds the limit"},
      {"huge header length", pack("{}", {}, ~0ull - 1), "exceeds the limit"},
      {"zero header", pack("", {}), "does not start with '{'"},
      {"not an object", pack("[1,2]   "), "does not start with '{'"},
      {"invalid JSON", pack("{\"t\":   "), "not valid JSON"},
      {"trailing garbage", pack("{}x", {}), "not valid JSON"},
      {"invalid UTF-8", pack("{\"\xff\":1}"), "not valid JSON"},
      {"entry not an object", pack(R"({"t":5})"), "is not an object"},
      {"missing field", pack(R"({"t":{"dtype":"F32","shape":[1]}})", four), "lacks one of"},
      {"unknown dtype", pack(R"({"t":{"dtype":"F48","shape":[1],"data_offsets":[0,4]}})", four), "unknown dtype"},
      {"dtype not string", pack(R"({"t":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", four), "not a string"},
      {"negative dim", pack(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", four), "non-negative integer"},
      {"float dim", pack(R"({"t":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", four), "non-negative integer"},
      {"shape overflow", pack(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", four), "shape [4294967296, 4294967296] overflows"},
      {"size mismatch", pack(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", four), "F32 shape [2] needs 8 bytes"},
      {"many dims", pack(R"({"t":{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1,2],"data_offsets":[0,4]}})", four), "U8 shape [1, 1, 1, 1, 1, 1, 1, 1, ... (10 dims)] needs 2 bytes"},
      {"offsets outside", pack(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", four), "run past the data buffer"},
      {"offsets reversed", pack(R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", four), "end before begin"},
      {"offsets not pair", pack(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", four), "is not [begin, end]"},
      {"overlap", pack(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", four), "overlaps"},
      {"partial overlap", pack(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"I32","shape":[1],"data_offsets":[4,8]}})", eight), "overlaps"},
      {"hole", pack(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight), "belong to no tensor"},
      {"trailing bytes", pack(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", eight), "trailing bytes"},
      {"duplicate names", pack(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight), "duplicate key 'a'"},
      {"metadata not strings", pack(R"({"__metadata__":{"k":1}})"), "is not a string"},
      {"metadata not object", pack(R"({"__metadata__":[]})"), "not an object of strings"},
      {"truncated data", truncated, "run past the data buffer"},
  };
  // clang-format on
}

TEST(Safetensors, RejectsMalformedFilesWithClearErrors) {
  for (const auto& c : malformed_cases()) {
    SCOPED_TRACE(c.label);
    expect_rejected(c.bytes, c.needle);
  }
}

// safetensors headers nest three levels (header -> entry or __metadata__ -> shape
// or data_offsets); a crafted header nesting 100,000 arrays (200 KB, well under the
// header limit) once crashed the error path, which printed the value recursively.
TEST(Safetensors, RejectsNestingDeeperThanTheFormatAllows) {
  const std::string deep = R"({"t":)" + std::string(100000, '[') + std::string(100000, ']') + "}";
  expect_rejected(pack(deep), "nests deeper than");
  expect_rejected(pack(R"({"t":{"dtype":"F32","shape":[[1]],"data_offsets":[0,4]}})", bytes_of(std::vector<float>{1.0f})),
                  "nests deeper than");
  expect_rejected(pack(R"({"__metadata__":{"k":[["a"]]}})"), "nests deeper than");
}

// Error messages name a container's kind and size instead of printing it.
TEST(Safetensors, ErrorsSummarizeContainersInsteadOfPrintingThem) {
  expect_rejected(pack(R"({"__metadata__":{"k":[1,2]}})"), "is not a string: array of 2");
  expect_rejected(pack(R"({"t":[1,2,3]})"), "is not an object: array of 3");
  expect_rejected(pack(R"({"t":{"dtype":"F32","shape":{"a":1},"data_offsets":[0,4]}})", bytes_of(std::vector<float>{1.0f})),
                  "shape is not an array");
}

TEST(Safetensors, OpenNamesTheFileInErrors) {
  test::TempDir dir;
  test::write_file(dir / "bad.safetensors", pack("[]      "));
  try {
    SafetensorsFile::open(dir / "bad.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_THROW(SafetensorsFile::open(dir / "missing.safetensors"), Error);
  EXPECT_THROW(SafetensorsFile::open(dir.path), Error);
}

TEST(Safetensors, ViewsStayValidAfterMove) {
  test::TempDir dir;
  const std::vector<float> v = {4, 5, 6};
  const TensorToWrite t{"v", DType::F32, {3}, std::as_bytes(std::span<const float>(v))};
  save_safetensors(dir / "v.safetensors", {&t, 1}, {});
  auto file = SafetensorsFile::open(dir / "v.safetensors");
  const std::byte* before = file.tensors()[0].data.data();
  SafetensorsFile moved = std::move(file);
  EXPECT_EQ(moved.tensors()[0].data.data(), before) << "zero-copy view into the mapping";
  EXPECT_EQ(moved.to_f32(moved.tensors()[0]), v);
}

// --- atomic saves ---

std::vector<TensorToWrite> big_tensor(const std::vector<float>& values) {
  return {{"big", DType::F32, {static_cast<std::int64_t>(values.size())},
           std::as_bytes(std::span<const float>(values))}};
}

// A write that fails midway (the file-size limit makes write() return EFBIG
// after 64 KiB) leaves the existing target byte-for-byte intact and no
// temporary file behind.
TEST(Safetensors, FailedWriteLeavesTargetIntact) {
  test::TempDir dir;
  const std::vector<float> old_values = {1, 2, 3};
  save_safetensors(dir / "ckpt.safetensors", big_tensor(old_values), {{"version", "old"}});
  const auto before = test::read_file(dir / "ckpt.safetensors");

  const std::vector<float> large(1 << 20, 0.5f);  // 4 MiB, well past the limit
  struct sigaction ignore {}, previous {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGXFSZ, &ignore, &previous);
  rlimit old_limit{};
  getrlimit(RLIMIT_FSIZE, &old_limit);
  rlimit limit = old_limit;
  limit.rlim_cur = 64 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limit), 0);
  std::string message;
  try {
    save_safetensors(dir / "ckpt.safetensors", big_tensor(large), {{"version", "new"}});
  } catch (const Error& e) {
    message = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old_limit);
  sigaction(SIGXFSZ, &previous, nullptr);

  EXPECT_NE(message.find("failed"), std::string::npos) << "the save must report the failure: " << message;
  EXPECT_EQ(test::read_file(dir / "ckpt.safetensors"), before);
  EXPECT_EQ(dir.entries(), 1u) << "the temporary file is removed";
  const auto file = SafetensorsFile::open(dir / "ckpt.safetensors");
  EXPECT_EQ(file.metadata().at("version"), "old");
}

// A save killed midway (SIGXFSZ's default action terminates the process while
// it writes) never damages the existing file.
TEST(Safetensors, InterruptedWriteLeavesTargetIntact) {
  test::TempDir dir;
  const std::vector<float> old_values = {1, 2, 3};
  save_safetensors(dir / "ckpt.safetensors", big_tensor(old_values), {{"version", "old"}});
  const auto before = test::read_file(dir / "ckpt.safetensors");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    signal(SIGXFSZ, SIG_DFL);
    rlimit limit{64 * 1024, 64 * 1024};
    setrlimit(RLIMIT_FSIZE, &limit);
    const std::vector<float> large(1 << 20, 0.5f);
    try {
      save_safetensors(dir / "ckpt.safetensors", big_tensor(large), {{"version", "new"}});
    } catch (...) {
      _exit(3);
    }
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child should have been killed mid-write";
  EXPECT_EQ(WTERMSIG(status), SIGXFSZ);
  EXPECT_EQ(test::read_file(dir / "ckpt.safetensors"), before);
  EXPECT_EQ(SafetensorsFile::open(dir / "ckpt.safetensors").metadata().at("version"), "old");
}

TEST(Safetensors, SaveReplacesTargetAndKeepsItsMode) {
  test::TempDir dir;
  const std::vector<float> a = {1}, b = {2, 3};
  save_safetensors(dir / "m.safetensors", big_tensor(a), {});
  std::filesystem::permissions(dir / "m.safetensors", std::filesystem::perms(0640));
  save_safetensors(dir / "m.safetensors", big_tensor(b), {});
  EXPECT_EQ(std::filesystem::status(dir / "m.safetensors").permissions(), std::filesystem::perms(0640));
  const auto file = SafetensorsFile::open(dir / "m.safetensors");
  EXPECT_EQ(file.to_f32(file.tensors()[0]), b);
  EXPECT_THROW(save_safetensors(dir / "no-such-dir" / "x.safetensors", big_tensor(a), {}), Error);
}

}  // namespace
}  // namespace posembed::io
