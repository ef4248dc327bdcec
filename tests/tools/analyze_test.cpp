#include "posembed/tools/analyze.h"
#include "posembed/tools/analyze_plot.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "posembed/core/error.h"
#include "posembed/core/init.h"
#include "tools/images.h"

namespace posembed::tools {
namespace {

// Column j holds +a_j at row j and -a_j at row j + m, zeros elsewhere: every
// column has mean 0 and the columns are orthogonal, so the singular values of
// the centred table are exactly a_j * sqrt(2).
std::vector<float> orthogonal_columns(const std::vector<float>& a, std::int64_t m) {
  const auto cols = static_cast<std::int64_t>(a.size());
  std::vector<float> t(static_cast<std::size_t>(2 * m * cols), 0.0f);
  for (std::int64_t j = 0; j < cols; ++j) {
    t[static_cast<std::size_t>(j * cols + j)] = a[static_cast<std::size_t>(j)];
    t[static_cast<std::size_t>((j + m) * cols + j)] = -a[static_cast<std::size_t>(j)];
  }
  return t;
}

TEST(Analyze, KnownSpectrum) {
  const std::vector<float> a = {4, 3, 2, 1, 0.25f};
  const std::int64_t m = 7, rows = 2 * m, cols = 5;
  const TableAnalysis r = analyze_table(orthogonal_columns(a, m), rows, cols);
  ASSERT_EQ(r.singular_values.size(), 5u);
  ASSERT_EQ(r.variance_ratio.size(), 5u);
  // A backward-stable SVD is exact to a small multiple of eps * ||A||.
  const double tol = 64 * DBL_EPSILON * 4 * std::sqrt(2.0);
  double sum_sq = 0, sum_4 = 0;
  for (float v : a) {
    sum_sq += double{v} * v;
    sum_4 += double{v} * v * v * v;
  }
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(r.singular_values[i], a[i] * std::sqrt(2.0), tol);
    EXPECT_NEAR(r.variance_ratio[i], double{a[i]} * a[i] / sum_sq, 1e-14);
  }
  // Cumulative variance 16, 25, 29, 30, 30.0625 of 30.0625: 53%, 83%, 96.5%, 99.8%, 100%.
  EXPECT_EQ(r.components_90, 3);
  EXPECT_EQ(r.components_95, 3);
  EXPECT_EQ(r.components_99, 4);
  EXPECT_NEAR(r.participation_ratio, sum_sq * sum_sq / sum_4, 1e-12);
  EXPECT_EQ(r.gap_rank, 4);  // 1 / 0.25 is the largest ratio
  EXPECT_NEAR(r.gap_ratio, 4.0, 1e-12);
  EXPECT_NEAR(r.mean_row_norm, 0.0, 1e-15);
}

TEST(Analyze, ComponentsFor) {
  const std::vector<double> ratio = {0.5, 0.3, 0.15, 0.05};
  EXPECT_EQ(components_for(ratio, 0.5), 1);
  EXPECT_EQ(components_for(ratio, 0.8), 2);
  EXPECT_EQ(components_for(ratio, 0.9), 3);
  EXPECT_EQ(components_for(ratio, 1.0), 4);
  EXPECT_THROW(components_for(ratio, 0.0), Error);
  EXPECT_THROW(components_for(ratio, 1.5), Error);
}

// rank-r table A (rows, r) B (r, cols) / sqrt(r) plus noise of std sigma, all
// from Philox normals.
std::vector<float> low_rank_table(std::int64_t rows, std::int64_t cols, std::int64_t r,
                                  double sigma, std::uint64_t seed) {
  std::vector<double> a(static_cast<std::size_t>(rows * r)), b(static_cast<std::size_t>(r * cols));
  for (std::size_t i = 0; i < a.size(); ++i)
    a[i] = standard_normal(seed, RandomStream::model_init, i);
  for (std::size_t i = 0; i < b.size(); ++i) {
    b[i] = standard_normal(seed, RandomStream::model_init, a.size() + i);
  }
  std::vector<float> t(static_cast<std::size_t>(rows * cols));
  for (std::int64_t p = 0; p < rows; ++p) {
    for (std::int64_t j = 0; j < cols; ++j) {
      double v = 0;
      for (std::int64_t k = 0; k < r; ++k) {
        v += a[static_cast<std::size_t>(p * r + k)] * b[static_cast<std::size_t>(k * cols + j)];
      }
      const auto idx = static_cast<std::uint64_t>(p * cols + j);
      t[idx] = static_cast<float>(v / std::sqrt(static_cast<double>(r)) +
                                  sigma * standard_normal(seed, RandomStream::position_init, idx));
    }
  }
  return t;
}

TEST(Analyze, RecoversRankOfLowRankPlusNoise) {
  struct Case {
    std::int64_t rows, cols, rank;
    double sigma;
  };
  // Noise std 1e-3 and 1e-2 against entries of std 1: the signal's smallest
  // singular value stays far above the noise's largest (about sigma (sqrt(rows) + sqrt(cols))).
  for (const Case c : {Case{128, 64, 1, 1e-3}, Case{128, 64, 3, 1e-3}, Case{128, 64, 7, 1e-2},
                       Case{128, 64, 16, 1e-3}, Case{64, 96, 5, 1e-2}, Case{300, 40, 12, 1e-2}}) {
    SCOPED_TRACE(testing::Message()
                 << c.rows << "x" << c.cols << " rank " << c.rank << " sigma " << c.sigma);
    const std::vector<float> t = low_rank_table(c.rows, c.cols, c.rank, c.sigma, 7 + c.rank);
    const TableAnalysis r = analyze_table(t, c.rows, c.cols);
    EXPECT_EQ(r.gap_rank, c.rank);
    EXPECT_GT(r.gap_ratio, 10.0);
    // Centring removes one dimension at most, and the noise carries well under 1%.
    EXPECT_LE(r.components_99, c.rank);
    EXPECT_GE(r.components_99, c.rank - 1);
    // PR <= r / (1 - f)^2 when the components past r carry a fraction f < 1%.
    EXPECT_LE(r.participation_ratio, static_cast<double>(c.rank) / (0.99 * 0.99));
  }
  // Exact rank, no noise: the zeros past the rank make the gap.
  const std::vector<float> t = low_rank_table(50, 30, 4, 0.0, 3);
  EXPECT_EQ(analyze_table(t, 50, 30).gap_rank, 4);
}

TEST(Analyze, NormsAndNeighbourCosines) {
  // Rows: e1, e1 + e2, -e1, 0, e2.
  const std::vector<float> t = {1, 0, 1, 1, -1, 0, 0, 0, 0, 1};
  const TableAnalysis r = analyze_table(t, 5, 2);
  const std::vector<double> norms = {1, std::sqrt(2.0), 1, 0, 1};
  const std::vector<double> cos = {1 / std::sqrt(2.0), -1 / std::sqrt(2.0), 0, 0};
  ASSERT_EQ(r.row_norms.size(), norms.size());
  ASSERT_EQ(r.neighbour_cosine.size(), cos.size());
  for (std::size_t i = 0; i < norms.size(); ++i) EXPECT_NEAR(r.row_norms[i], norms[i], 1e-15);
  for (std::size_t i = 0; i < cos.size(); ++i) EXPECT_NEAR(r.neighbour_cosine[i], cos[i], 1e-15);
  EXPECT_EQ(r.zero_rows, 1);
}

TEST(Analyze, CosineMatrixSubsamples) {
  const std::vector<float> t = low_rank_table(23, 9, 9, 0.1, 5);
  const std::vector<float> full = cosine_matrix(t, 23, 9, 1);
  const std::vector<float> sub = cosine_matrix(t, 23, 9, 4);  // positions 0, 4, ..., 20
  ASSERT_EQ(full.size(), 23u * 23u);
  ASSERT_EQ(sub.size(), 6u * 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_NEAR(full[i * 23 + i], 1.0f, 4 * FLT_EPSILON);
    for (std::size_t j = 0; j < 6; ++j) EXPECT_EQ(sub[i * 6 + j], full[(4 * i) * 23 + 4 * j]);
  }
  // Against a plain double loop for one pair.
  double dot = 0, n3 = 0, n17 = 0;
  for (int j = 0; j < 9; ++j) {
    dot += double{t[3 * 9 + j]} * t[17 * 9 + j];
    n3 += double{t[3 * 9 + j]} * t[3 * 9 + j];
    n17 += double{t[17 * 9 + j]} * t[17 * 9 + j];
  }
  EXPECT_NEAR(full[3 * 23 + 17], dot / std::sqrt(n3 * n17), 4 * FLT_EPSILON);  // float output
}

TEST(Analyze, RejectsBadTables) {
  std::vector<float> t(12, 1.0f);
  EXPECT_THROW(analyze_table(t, 1, 12), Error);  // one row: nothing to compare
  EXPECT_THROW(analyze_table(t, 5, 3), Error);   // 15 != 12 values
  t[7] = std::nanf("");
  EXPECT_THROW(analyze_table(t, 4, 3), Error);
  // All rows equal: zero spectrum, reported without dividing by zero.
  const TableAnalysis r = analyze_table(std::vector<float>(12, 0.5f), 4, 3);
  ASSERT_EQ(r.row_norms.size(), 4u);
  ASSERT_EQ(r.neighbour_cosine.size(), 3u);
  EXPECT_EQ(r.components_90, 0);
  EXPECT_EQ(r.participation_ratio, 0.0);
  EXPECT_NEAR(r.neighbour_cosine[0], 1.0, 1e-15);
}

// The NumPy reference (tests/python/analyze_reference.py) on a smooth table with noise.
TEST(Analyze, MatchesNumPy) {
  std::ifstream ref_in(ANALYZE_REFERENCE_DIR "/analyze_reference.json");
  ASSERT_TRUE(ref_in) << "missing reference; run analyze_reference.py write";
  const nlohmann::json ref = nlohmann::json::parse(ref_in);
  ASSERT_EQ(ref.at("format"), "posembed-analyze-reference");
  const std::int64_t rows = ref.at("rows"), cols = ref.at("cols");
  std::vector<float> t(static_cast<std::size_t>(rows * cols));
  std::ifstream raw(ANALYZE_REFERENCE_DIR "/analyze_table.f32", std::ios::binary);
  raw.read(reinterpret_cast<char*>(t.data()), static_cast<std::streamsize>(t.size() * 4));
  ASSERT_TRUE(raw) << "short table file";

  const TableAnalysis r = analyze_table(t, rows, cols);
  const auto s = ref.at("singular_values").get<std::vector<double>>();
  ASSERT_EQ(s.size(), static_cast<std::size_t>(std::min(rows, cols)));
  ASSERT_EQ(r.singular_values.size(), s.size());
  // Two double SVDs of the same matrix: agreement to ~n eps s_max; 1e-12 s_max leaves margin.
  for (std::size_t i = 0; i < s.size(); ++i) EXPECT_NEAR(r.singular_values[i], s[i], 1e-12 * s[0]);
  EXPECT_EQ(r.components_90, ref.at("components").at("90").get<std::int64_t>());
  EXPECT_EQ(r.components_95, ref.at("components").at("95").get<std::int64_t>());
  EXPECT_EQ(r.components_99, ref.at("components").at("99").get<std::int64_t>());
  EXPECT_NEAR(r.participation_ratio, ref.at("participation_ratio").get<double>(), 1e-10);
  const auto norms = ref.at("row_norms").get<std::vector<double>>();
  const auto cos = ref.at("neighbour_cosine").get<std::vector<double>>();
  ASSERT_EQ(norms.size(), static_cast<std::size_t>(rows));
  ASSERT_EQ(cos.size(), static_cast<std::size_t>(rows - 1));
  ASSERT_EQ(r.row_norms.size(), norms.size());
  ASSERT_EQ(r.neighbour_cosine.size(), cos.size());
  for (std::size_t i = 0; i < norms.size(); ++i)
    EXPECT_NEAR(r.row_norms[i], norms[i], 1e-13 * norms[i]);
  for (std::size_t i = 0; i < cos.size(); ++i) EXPECT_NEAR(r.neighbour_cosine[i], cos[i], 1e-13);
}

// The plots in both formats; the heatmap's cells show the cosines of the table
// (cosine_matrix, checked against NumPy above) in the diverging colours.
TEST(Analyze, WritesPlots) {
  const std::vector<float> t = low_rank_table(40, 16, 3, 0.05, 11);
  const TableAnalysis r = analyze_table(t, 40, 16);
  const auto dir = std::filesystem::path(ANALYZE_REFERENCE_DIR);
  write_table_heatmap(dir / "test.heatmap.png", t, 40, 16, "test");
  write_spectrum_plot(dir / "test.spectrum.png", r, "test");
  const readback::PngImage heat = readback::read_png(dir / "test.heatmap.png");
  const readback::PngImage spectrum = readback::read_png(dir / "test.spectrum.png");
  EXPECT_TRUE(heat.rgb8 && spectrum.rgb8);
  EXPECT_GE(spectrum.height, 2 * 300);  // two panels
  const PixelBox cells = heatmap_cells(40);
  const int side = cells.w / 40;
  const std::vector<float> cos = cosine_matrix(t, 40, 16);
  for (int i = 0; i < 40; ++i) {
    for (int j = 0; j < 40; ++j) {
      const Rgb want = diverging_colour(cos[static_cast<std::size_t>(i * 40 + j)]);
      ASSERT_TRUE(readback::same(
          heat.at(cells.x + j * side + side / 2, cells.y + i * side + side / 2), want))
          << "cell " << i << ", " << j;
    }
  }

  write_table_heatmap(dir / "test.heatmap.svg", t, 40, 16, "test");
  write_spectrum_plot(dir / "test.spectrum.svg", r, "test");
  EXPECT_EQ(readback::read_svg(dir / "test.heatmap.svg").count("image"), 1);
  const readback::SvgSummary svg = readback::read_svg(dir / "test.spectrum.svg");
  EXPECT_EQ(svg.root_attributes.at("width"), std::to_string(spectrum.width) + "px");
  EXPECT_EQ(svg.root_attributes.at("height"), std::to_string(spectrum.height) + "px");
  EXPECT_THROW(write_spectrum_plot(dir / "no-such-dir" / "x.png", r, "test"), Error);
}

// All rows equal: every singular value is 0; the spectrum says so instead of
// failing on a log axis.
TEST(Analyze, SpectrumOfAConstantTable) {
  const std::vector<float> t(6 * 4, 0.5f);
  const TableAnalysis r = analyze_table(t, 6, 4);
  const auto path = std::filesystem::path(ANALYZE_REFERENCE_DIR) / "constant.spectrum.png";
  write_spectrum_plot(path, r, "constant");
  EXPECT_GT(readback::read_png(path).width, 0);
}

TEST(Analyze, JsonAndText) {
  const std::vector<float> t = low_rank_table(20, 8, 2, 1e-3, 2);
  const TableAnalysis r = analyze_table(t, 20, 8);
  const nlohmann::json j = nlohmann::json::parse(analysis_json(r, "x"));
  EXPECT_EQ(j.at("format"), "posembed-analyze");
  EXPECT_EQ(j.at("gap_rank"), 2);
  EXPECT_EQ(j.at("row_norms").size(), 20u);
  EXPECT_EQ(j.at("neighbour_cosine").size(), 19u);
  EXPECT_NE(format_analysis(r, "x").find("participation ratio"), std::string::npos);
}

}  // namespace
}  // namespace posembed::tools
