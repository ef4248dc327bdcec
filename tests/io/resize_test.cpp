#include "posembed/io/resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include "io/io_test_util.h"
#include "posembed/core/error.h"
#include "posembed/core/init.h"
#include "posembed/io/checkpoint.h"

namespace posembed::io {
namespace {

// Plain-loop reference in double: rows of the resized usable part.
// table: (M, d) values; returns (N, d).
std::vector<double> reference_rows(const std::vector<double>& table, std::int64_t m, std::int64_t n,
                                   std::int64_t d, ResizeMethod method) {
  std::vector<double> out(static_cast<std::size_t>(n * d));
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t j = 0; j < d; ++j) {
      double v = 0;
      if (method == ResizeMethod::crop) v = table[static_cast<std::size_t>(i * d + j)];
      if (method == ResizeMethod::tile) v = table[static_cast<std::size_t>((i % m) * d + j)];
      if (method == ResizeMethod::interpolate) {
        // F.interpolate(mode="linear", align_corners=False): sample at
        // (i + 0.5) * M / N - 0.5, clamped to [0, M - 1].
        const double x = std::clamp((static_cast<double>(i) + 0.5) * static_cast<double>(m) / static_cast<double>(n) - 0.5,
                                    0.0, static_cast<double>(m - 1));
        const auto i0 = static_cast<std::int64_t>(std::floor(x));
        const std::int64_t i1 = std::min(i0 + 1, m - 1);
        const double w = x - static_cast<double>(i0);
        v = (1 - w) * table[static_cast<std::size_t>(i0 * d + j)] + w * table[static_cast<std::size_t>(i1 * d + j)];
      }
      out[static_cast<std::size_t>(i * d + j)] = v;
    }
  }
  return out;
}

std::vector<float> random_values(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(standard_normal(seed, RandomStream::model_init, i));
  return v;
}

TEST(Resize, MatchesPlainLoopOverAwkwardSizesAndDTypes) {
  const std::int64_t d = 5;
  for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::F64}) {
    for (std::int64_t offset : {0, 2}) {
      for (std::int64_t m : {1, 3, 7, 16}) {
        for (std::int64_t n : {1, 2, 5, 8, 17, 33}) {
          for (ResizeMethod method : {ResizeMethod::crop, ResizeMethod::tile, ResizeMethod::interpolate}) {
            if ((method == ResizeMethod::crop && n >= m) || (method == ResizeMethod::tile && n <= m) ||
                (method == ResizeMethod::interpolate && n == m)) {
              continue;
            }
            SCOPED_TRACE(std::string(dtype_name(dtype)) + " offset " + std::to_string(offset) + " " +
                         std::to_string(m) + " -> " + std::to_string(n) + " " + std::string(to_string(method)));
            const auto input = convert_from_f32(dtype, random_values(static_cast<std::size_t>((offset + m) * d), 7));
            const RowResize r{offset, m, n, d, method, {}, 1};
            const auto output = resize_rows(input, dtype, r);
            const std::size_t row = static_cast<std::size_t>(d) * dtype_size(dtype);
            ASSERT_EQ(output.size(), static_cast<std::size_t>(offset + n) * row);
            EXPECT_EQ(std::memcmp(output.data(), input.data(), static_cast<std::size_t>(offset) * row), 0)
                << "offset rows are copied unchanged";
            const auto in_values = convert_to_f64(dtype, std::span(input).subspan(static_cast<std::size_t>(offset) * row));
            const auto want = reference_rows(in_values, m, n, d, method);
            const auto got = convert_to_f64(dtype, std::span(output).subspan(static_cast<std::size_t>(offset) * row));
            double max_abs = 0;
            for (double v : in_values) max_abs = std::max(max_abs, std::abs(v));
            for (std::size_t k = 0; k < want.size(); ++k) {
              if (method != ResizeMethod::interpolate) {
                ASSERT_EQ(got[k], want[k]) << "element " << k << ": crop and tile copy exactly";
                continue;
              }
              // fp32 arithmetic: the source index x <= M carries up to (M + 1) eps
              // of error (scale M/N, product, subtraction), which moves the weight
              // as much and the value by that times |b - a| <= 2 max|x|; the two
              // products and the sum add 4 eps max|x|; then one rounding to the dtype.
              const double eps = std::numeric_limits<float>::epsilon();
              const double dtype_eps = dtype == DType::F16 ? 0x1p-11 : dtype == DType::BF16 ? 0x1p-8 : 0.0;
              const double tol = (2.0 * static_cast<double>(m + 1) + 4.0) * eps * max_abs + dtype_eps * std::abs(want[k]);
              ASSERT_NEAR(got[k], want[k], tol) << "element " << k;
            }
          }
        }
      }
    }
  }
}

// PyTorch: F.interpolate(torch.tensor([[[0., 1.]]]), size=4, mode="linear") == [0, .25, .75, 1].
TEST(Resize, InterpolateMatchesPyTorchsLinearConvention) {
  const std::vector<float> table = {0.0f, 1.0f};  // (2, 1)
  const auto out = resize_rows(std::as_bytes(std::span(table)), DType::F32, {0, 2, 4, 1, ResizeMethod::interpolate, {}, 0});
  EXPECT_EQ(convert_to_f32(DType::F32, out), (std::vector<float>{0.0f, 0.25f, 0.75f, 1.0f}));
}

// Shrinking 8,388,612 rows to 8,388,610 puts the fp32 source index of the last row
// at exactly 8,388,612 (= old_len, one past the table) after rounding; PyTorch clamps
// it to old_len - 1 (min(floor(x), in - 1)), so the last row is the old last row.
TEST(Resize, InterpolateClampsTheSourceIndexToTheTable) {
  constexpr std::int64_t m = 8388612, n = 8388610;
  std::vector<float> table(static_cast<std::size_t>(m));  // (m, 1)
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<float>(i % 1000) + 1.0f;
  const auto out = resize_rows(std::as_bytes(std::span(table)), DType::F32, {0, m, n, 1, ResizeMethod::interpolate, {}, 0});
  ASSERT_EQ(out.size(), static_cast<std::size_t>(n) * sizeof(float));
  float last = 0.0f;
  std::memcpy(&last, out.data() + out.size() - sizeof(float), sizeof(float));
  EXPECT_EQ(last, table.back());
}

TEST(Resize, InitKeepsOldRowsAndDrawsNewRowsFromTheResizeStream) {
  const std::int64_t offset = 2, m = 6, n = 11, d = 4;
  const auto old_values = random_values(static_cast<std::size_t>((offset + m) * d), 3);
  const TableInit init{InitKind::trunc_normal, 0.5};
  const auto out_bytes = resize_rows(std::as_bytes(std::span(old_values)), DType::F32,
                                     {offset, m, n, d, ResizeMethod::init, init, 99});
  const auto out = convert_to_f32(DType::F32, out_bytes);
  for (std::size_t i = 0; i < old_values.size(); ++i) ASSERT_EQ(out[i], old_values[i]);
  std::vector<float> fresh(static_cast<std::size_t>((offset + n) * d));
  init_table(fresh, init, d, 99, RandomStream::resize_init);  // the whole table from index 0
  for (std::size_t i = old_values.size(); i < out.size(); ++i) {
    ASSERT_EQ(out[i], fresh[i]) << "new row element " << i << " is the resize stream's element at its flat index";
    ASSERT_LE(std::abs(out[i]), 2 * 0.5f) << "truncated at 2 std";
  }
  const auto other_seed = convert_to_f32(
      DType::F32, resize_rows(std::as_bytes(std::span(old_values)), DType::F32, {offset, m, n, d, ResizeMethod::init, init, 100}));
  EXPECT_NE(other_seed.back(), out.back());
}

// New rows drawn beyond the file's dtype would be written as infinities, a
// table every loader refuses: an error naming the count and the limit, and
// nothing returned. A std that fits is kept, draws that round to the largest
// finite value included.
TEST(Resize, InitThatOverflowsTheDTypeIsRefused) {
  const std::vector<float> table(8, 0.25f);  // (4, 2)
  const auto f16 = convert_from_f32(DType::F16, table);
  const RowResize wide{0, 4, 40, 2, ResizeMethod::init, {InitKind::normal, 1e5}, 1};
  try {
    resize_rows(f16, DType::F16, wide);
    ADD_FAILURE() << "normal:1e5 into F16 accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("new values outside F16's finite range (largest 65504)"), std::string::npos)
        << what;
    EXPECT_NE(what.find(" of 72 new values"), std::string::npos) << what;
  }
  const auto f32 =
      convert_to_f32(DType::F32, resize_rows(std::as_bytes(std::span(table)), DType::F32, wide));
  EXPECT_TRUE(std::all_of(f32.begin(), f32.end(), [](float x) { return std::isfinite(x); }));
  const RowResize fits{0, 4, 40, 2, ResizeMethod::init, {InitKind::trunc_normal, 3e4},
                       1};  // |x| <= 6e4
  const auto narrow = convert_to_f32(DType::F16, resize_rows(f16, DType::F16, fits));
  EXPECT_TRUE(std::all_of(narrow.begin(), narrow.end(), [](float x) { return std::isfinite(x); }));
  EXPECT_THROW(resize_rows(std::as_bytes(std::span(table)), DType::F32,
                           {0, 4, 40, 2, ResizeMethod::init, {InitKind::normal, 1e39}, 1}),
               Error);
}

TEST(Resize, RejectsRequestsThatMakeNoSense) {
  const std::vector<float> table(8);
  auto rejects = [&](RowResize r, const std::string& needle) {
    try {
      resize_rows(std::as_bytes(std::span(table)), DType::F32, r);
      ADD_FAILURE() << "accepted; expected " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  rejects({0, 4, 8, 2, ResizeMethod::crop, {}, 0}, "crop keeps the first rows");
  rejects({0, 4, 3, 2, ResizeMethod::tile, {}, 0}, "tile grows the table");
  rejects({0, 4, 4, 2, ResizeMethod::interpolate, {}, 0}, "already");
  rejects({0, 4, 0, 2, ResizeMethod::interpolate, {}, 0}, "must be >= 1");
  rejects({0, 3, 6, 2, ResizeMethod::tile, {}, 0}, "bytes");
  rejects({0, 4, std::int64_t{1} << 62, 2, ResizeMethod::tile, {}, 0}, "overflows");
  EXPECT_THROW(parse_resize_method("bicubic"), Error);
}

TEST(Resize, CheckpointKeepsOtherTensorsMetadataAndDType) {
  test::TempDir dir;
  // An OPT-like BF16 checkpoint: 2 offset rows + 8 positions.
  const auto pos = convert_from_f32(DType::BF16, random_values(10 * 4, 1));
  const auto tok = convert_from_f32(DType::BF16, random_values(20 * 4, 2));
  const std::vector<std::int64_t> ids = {1, 2, 3};
  const std::vector<TensorToWrite> tensors = {
      {"model.decoder.embed_tokens.weight", DType::BF16, {20, 4}, tok},
      {"model.decoder.embed_positions.weight", DType::BF16, {10, 4}, pos},
      {"ids", DType::I64, {3}, std::as_bytes(std::span(ids))}};
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "kept"}};
  save_safetensors(dir / "opt.safetensors", tensors, meta);
  ResizeOptions options;
  options.max_seq_len = 16;
  options.method = ResizeMethod::tile;
  const ResizeReport r = resize_checkpoint(dir / "opt.safetensors", dir / "opt16.safetensors", options);
  EXPECT_EQ(r.rows.offset_rows, 2);
  EXPECT_EQ(r.rows.old_len, 8);
  EXPECT_EQ(r.tensors_copied, 2);
  const auto in = SafetensorsFile::open(dir / "opt.safetensors");
  const auto out = SafetensorsFile::open(dir / "opt16.safetensors");
  EXPECT_EQ(out.metadata(), meta);
  for (const auto& t : in.tensors()) {
    const TensorInfo* o = out.find(t.name);
    ASSERT_NE(o, nullptr);
    EXPECT_EQ(o->dtype, t.dtype);
    if (t.name == "model.decoder.embed_positions.weight") {
      EXPECT_EQ(o->shape, (std::vector<std::int64_t>{18, 4}));
      const std::size_t row = 4 * 2;
      EXPECT_EQ(std::memcmp(o->data.data(), t.data.data(), t.data.size()), 0);  // offset + first 8 rows
      for (std::size_t i = 8; i < 16; ++i) {
        EXPECT_EQ(std::memcmp(o->data.data() + (2 + i) * row, t.data.data() + (2 + i - 8) * row, row), 0);
      }
    } else {
      EXPECT_EQ(o->shape, t.shape);
      EXPECT_EQ(std::memcmp(o->data.data(), t.data.data(), t.data.size()), 0);
    }
  }
}

// A bare BERT-named table of 66 rows is taken for RoBERTa's 64 + 2 from its
// row count alone; resized to 100 positions (102 rows) it no longer suggests
// the offset, so resize records it, and a second resize keeps the 2 rows.
TEST(Resize, AnOffsetTheNamesDoNotImplyIsRecordedForTheNextResize) {
  test::TempDir dir;
  const auto pos = convert_from_f32(DType::F16, random_values(66 * 4, 3));
  const std::vector<TensorToWrite> bare = {
      {"embeddings.position_embeddings.weight", DType::F16, {66, 4}, pos}};
  const std::map<std::string, std::string> pt = {{"format", "pt"}};
  save_safetensors(dir / "bare.safetensors", bare, pt);
  ResizeOptions options;
  options.max_seq_len = 100;
  options.method = ResizeMethod::interpolate;
  const ResizeReport first =
      resize_checkpoint(dir / "bare.safetensors", dir / "r100.safetensors", options);
  EXPECT_EQ(first.rows.offset_rows, 2);
  const auto r100 = SafetensorsFile::open(dir / "r100.safetensors");
  EXPECT_EQ(r100.metadata().at(kOffsetRowsKey), "2");
  EXPECT_EQ(r100.metadata().at("format"), "pt");
  EXPECT_EQ(detect_tables(r100).offset_rows, 2);
  EXPECT_EQ(detect_tables(r100).max_seq_len, 100);
  options.max_seq_len = 200;
  const ResizeReport second =
      resize_checkpoint(dir / "r100.safetensors", dir / "r200.safetensors", options);
  EXPECT_EQ(second.rows.offset_rows, 2);
  EXPECT_EQ(second.rows.old_len, 100);
  const auto r200 = SafetensorsFile::open(dir / "r200.safetensors");
  const TensorInfo* table = r200.find("embeddings.position_embeddings.weight");
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->shape, (std::vector<std::int64_t>{202, 4}));
  EXPECT_EQ(std::memcmp(table->data.data(), pos.data(), 2 * 4 * 2),
            0);  // the offset rows, untouched
  EXPECT_EQ(r200.metadata().at(kOffsetRowsKey), "2");

  // An offset given explicitly is recorded too, and one the names imply is not
  // (the OPT test above: the metadata unchanged); a value that is no row count
  // is ignored with a note.
  options.detect.offset_rows = 0;
  options.max_seq_len = 64;
  resize_checkpoint(dir / "bare.safetensors", dir / "zero.safetensors", options);
  const auto zero = SafetensorsFile::open(dir / "zero.safetensors");
  EXPECT_EQ(zero.metadata().at(kOffsetRowsKey), "0");
  EXPECT_EQ(detect_tables(zero).offset_rows, 0);
  const std::map<std::string, std::string> negative = {{kOffsetRowsKey, "-1"}};
  save_safetensors(dir / "bad.safetensors", bare, negative);
  const DetectedTables bad = detect_tables(SafetensorsFile::open(dir / "bad.safetensors"));
  EXPECT_EQ(bad.offset_rows, 2);  // the row count's guess
  ASSERT_FALSE(bad.notes.empty());
  EXPECT_NE(bad.notes.back().find("not a row count"), std::string::npos) << bad.notes.back();
}

TEST(Resize, LayerCheckpointGrowsInPlaceAndReloads) {
  test::TempDir dir;
  const EmbeddingConfig config{.vocab_size = 11, .max_seq_len = 5, .embed_dim = 3, .dropout = 0.0, .seed = 42,
                               .token_init = {}, .position_init = {InitKind::normal, 0.7}};
  const EmbeddingLayer layer = make_embedding_layer(config);
  save_layer(dir / "layer.safetensors", layer);
  ResizeOptions options;
  options.max_seq_len = 9;
  options.method = ResizeMethod::init;
  resize_checkpoint(dir / "layer.safetensors", dir / "layer.safetensors", options);
  const EmbeddingLayer grown = load_layer(dir / "layer.safetensors");
  EXPECT_EQ(grown.config.max_seq_len, 9);
  EXPECT_EQ(grown.token_table, layer.token_table);
  std::vector<float> expect(9 * 3);
  init_table(expect, config.position_init, 3, 42, RandomStream::resize_init);  // the layer's own init and seed
  for (std::size_t i = 0; i < expect.size(); ++i) {
    EXPECT_EQ(grown.position_table[i], i < 15 ? layer.position_table[i] : expect[i]) << i;
  }
  EXPECT_EQ(dir.entries(), 1u);
}

}  // namespace
}  // namespace posembed::io
