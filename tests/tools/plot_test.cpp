#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "posembed/core/error.h"
#include "posembed/tools/plot.h"
#include "tools/images.h"

namespace posembed::tools {
namespace {

using readback::distance;
using readback::read_png;
using readback::read_svg;
using readback::same;

// In the build tree, not /tmp: other checkouts' test runs cannot collide with it.
std::filesystem::path out_file(const char* name, const char* extension) {
  return std::filesystem::path(PLOT_TEST_DIR) / (std::string("plot_") + name + extension);
}

LinePlot two_series() {
  // Move-assigned strings: GCC 12 warns falsely (-Wrestrict, PR105651) on
  // assigning a literal to a std::string member here.
  LinePlot p;
  p.title = std::string("Test plot: T^2 and s_{k}");
  p.x_label = std::string("x axis");
  p.y_label = std::string("y axis");
  p.series.push_back(
      {"A", series_colour(0), {1, 2, 3}, {3, 2, 1}, {2.5, 1.5, 0.5}, {3.5, 2.5, 1.5}, true, false});
  p.series.push_back({"B", series_colour(1), {1, 3}, {1, 4}, {}, {}, false, true});
  return p;
}

// Pixels within +-radius of (x, y) of exactly this colour.
int count_colour(const readback::PngImage& img, double x, double y, int radius, Rgb c) {
  int n = 0;
  for (int py = static_cast<int>(y) - radius; py <= static_cast<int>(y) + radius; ++py) {
    for (int px = static_cast<int>(x) - radius; px <= static_cast<int>(x) + radius; ++px) {
      n += px >= 0 && py >= 0 && px < img.width && py < img.height && same(img.at(px, py), c);
    }
  }
  return n;
}

TEST(LinePlot, WritesAnRgbPngOfTheRequestedSize) {
  LinePlot p = two_series();
  p.width = 640;
  p.height = 300;
  const auto path = out_file("size", ".png");
  write_line_plot(path, p);
  const readback::PngImage img = read_png(path);
  EXPECT_EQ(img.width, 640);
  EXPECT_EQ(img.height, 300);
  EXPECT_TRUE(img.rgb8);
  EXPECT_TRUE(same(img.at(0, 0), kWhite));
  p.log_x = p.log_y = true;  // all values positive: fine on log axes
  write_line_plot(path, p);
  EXPECT_EQ(read_png(path).width, 640);
  std::filesystem::remove(path);
}

TEST(LinePlot, WritesAWellFormedSvg) {
  LinePlot p = two_series();
  p.width = 640;
  p.height = 300;
  const auto path = out_file("svg", ".SVG");  // the extension in any case
  write_line_plot(path, p);
  const readback::SvgSummary svg = read_svg(path);
  EXPECT_EQ(svg.root, "http://www.w3.org/2000/svg|svg");
  EXPECT_EQ(svg.root_attributes.at("width"), "640px");
  EXPECT_EQ(svg.root_attributes.at("height"), "300px");
  // Lines, band, markers, frame and grid are paths; the text is glyphs drawn by <use>.
  EXPECT_GE(svg.count("path"), 10);
  EXPECT_GE(svg.count("use"), 20);
  std::filesystem::remove(path);
}

// Every point lands where the documented mapping puts it, on linear and log
// axes: the pixel under a marker has the series' colour.
TEST(LinePlot, PointsLandWhereTheAxesPutThem) {
  for (const bool log : {false, true}) {
    LinePlot p;
    p.log_x = p.log_y = log;
    p.y_min = log ? 0.1 : -2;
    p.y_max = log ? 1000 : 8;
    const std::vector<double> x{1, 3, 10, 30, 100}, y{0.5, 7, 1, 200, 3};
    p.series.push_back({"", series_colour(2), x, y, {}, {}, true, false});
    const auto path = out_file("mapping", ".png");
    write_line_plot(path, p);
    const readback::PngImage img = read_png(path);
    const PixelBox f = line_plot_frame(p);
    ASSERT_GT(f.w, 400);
    ASSERT_GT(f.h, 300);
    const auto fraction = [&](double v, double lo, double hi) {
      return log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo))
                 : (v - lo) / (hi - lo);
    };
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (!log && y[i] > p.y_max) continue;  // 200 is off the linear axis
      const double px = f.x + f.w * fraction(x[i], 1, 100);
      const double py = f.y + f.h * (1 - fraction(y[i], p.y_min, p.y_max));
      EXPECT_TRUE(same(img.at(static_cast<int>(px), static_cast<int>(py)), series_colour(2)))
          << "log " << log << " point " << i << " at " << px << ", " << py;
    }
    std::filesystem::remove(path);
  }
}

// A non-finite point breaks the line: nothing of the series' colour between
// its neighbours, a line on both sides of the gap.
TEST(LinePlot, NonFinitePointsLeaveAGap) {
  LinePlot p;
  p.y_min = 0;
  p.y_max = 2;
  p.series.push_back(
      {"", series_colour(3), {0, 1, 2, 3, 4}, {1, 1, NAN, 1, 1}, {}, {}, false, false});
  const auto path = out_file("gap", ".png");
  write_line_plot(path, p);
  const readback::PngImage img = read_png(path);
  const PixelBox f = line_plot_frame(p);
  const double mid_y = f.y + f.h / 2.0;
  const auto at_x = [&](double x) { return f.x + f.w * x / 4; };
  EXPECT_GT(count_colour(img, at_x(0.5), mid_y, 2, series_colour(3)), 0);
  EXPECT_EQ(count_colour(img, at_x(1.5), mid_y, 2, series_colour(3)), 0);
  EXPECT_EQ(count_colour(img, at_x(2.5), mid_y, 2, series_colour(3)), 0);
  EXPECT_GT(count_colour(img, at_x(3.5), mid_y, 2, series_colour(3)), 0);
  std::filesystem::remove(path);
}

TEST(LinePlot, AxisTicksAndTheirLabels) {
  const auto values = [](const std::vector<AxisTick>& ticks) {
    std::vector<double> v;
    for (const AxisTick& t : ticks) v.push_back(t.value);
    return v;
  };
  const auto labels = [](const std::vector<AxisTick>& ticks) {
    std::vector<std::string> v;
    for (const AxisTick& t : ticks) v.push_back(t.label);
    return v;
  };
  const auto lin = axis_ticks(false, -0.3, 1.05);  // step 0.2 gives 7 ticks, the nearest to 8
  ASSERT_EQ(lin.size(), 7u);
  for (std::size_t i = 0; i < lin.size(); ++i)
    EXPECT_NEAR(lin[i].value, -0.2 + 0.2 * static_cast<double>(i), 1e-12);
  EXPECT_EQ(labels(lin), (std::vector<std::string>{"-0.2", "0", "0.2", "0.4", "0.6", "0.8", "1"}));
  // Large values as powers of ten.
  EXPECT_EQ(labels(axis_ticks(false, 0, 4e5)),
            (std::vector<std::string>{"0", "50000", "10^{5}", "1.5×10^{5}", "2×10^{5}",
                                      "2.5×10^{5}", "3×10^{5}", "3.5×10^{5}", "4×10^{5}"}));
  // A log axis over 2.6 decades: 1, 2, 5 x 10^k as plain numbers.
  const auto few = axis_ticks(true, 1, 384);
  EXPECT_EQ(values(few), (std::vector<double>{1, 2, 5, 10, 20, 50, 100, 200}));
  EXPECT_EQ(labels(few), (std::vector<std::string>{"1", "2", "5", "10", "20", "50", "100", "200"}));
  // Over 8 decades: only the powers, labelled 10^k.
  const auto many = axis_ticks(true, 1e-7, 10);
  ASSERT_EQ(many.size(), 9u);
  for (int k = -7; k <= 1; ++k) {
    EXPECT_NEAR(many[static_cast<std::size_t>(k + 7)].value, std::pow(10.0, k),
                1e-9 * std::pow(10.0, k));
    EXPECT_EQ(many[static_cast<std::size_t>(k + 7)].label, "10^{" + std::to_string(k) + "}");
  }
  // 3 decades of small values: still plain numbers.
  EXPECT_EQ(labels(axis_ticks(true, 0.001, 1)),
            (std::vector<std::string>{"0.001", "0.002", "0.005", "0.01", "0.02", "0.05", "0.1",
                                      "0.2", "0.5", "1"}));
  // Below 1e-3: every tick in powers of ten.
  EXPECT_EQ(
      labels(axis_ticks(true, 2e-5, 8e-4)),
      (std::vector<std::string>{"2×10^{-5}", "5×10^{-5}", "10^{-4}", "2×10^{-4}", "5×10^{-4}"}));
}

TEST(LinePlot, NiceTicks) {
  EXPECT_EQ(nice_ticks(0, 511, 8), (std::vector<double>{0, 100, 200, 300, 400, 500}));
  EXPECT_EQ(nice_ticks(0, 127, 8), (std::vector<double>{0, 20, 40, 60, 80, 100, 120}));
  EXPECT_EQ(nice_ticks(3, 3, 8), (std::vector<double>{3}));  // an empty range: its one value
}

TEST(LinePlot, RejectsBadInputAndLeavesTheFileAsItWas) {
  const auto path = out_file("bad", ".png");
  { std::ofstream(path) << "an earlier file"; }
  LinePlot p = two_series();
  p.series[1].y.pop_back();
  EXPECT_THROW(write_line_plot(path, p), Error);  // x and y sizes differ
  p = two_series();
  p.series[0].y_lo.pop_back();
  EXPECT_THROW(write_line_plot(path, p), Error);  // band size differs
  p = two_series();
  p.series[0].y[0] = 0;
  p.log_y = true;
  EXPECT_THROW(write_line_plot(path, p), Error);  // 0 on a log axis
  p = two_series();
  for (auto& s : p.series) std::fill(s.y.begin(), s.y.end(), NAN);
  EXPECT_THROW(write_line_plot(path, p), Error);  // nothing finite to draw
  p = two_series();
  p.width = 100;
  EXPECT_THROW(write_line_plot(path, p), Error);  // too small
  std::ifstream in(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "an earlier file");
  std::filesystem::remove(path);

  const auto jpg = out_file("bad", ".jpg");
  EXPECT_THROW(write_line_plot(jpg, two_series()), Error);  // neither .png nor .svg
  EXPECT_FALSE(std::filesystem::exists(jpg));
  EXPECT_THROW(write_line_plot("/nonexistent-dir/x.png", two_series()), Error);
}

TEST(LinePlot, SeriesColoursDifferAndCycle) {
  for (int i = 0; i < 8; ++i) {
    for (int j = i + 1; j < 8; ++j)
      EXPECT_FALSE(same(series_colour(i), series_colour(j))) << i << " " << j;
  }
  EXPECT_TRUE(same(series_colour(9), series_colour(1)));
}

TEST(Heatmap, DivergingColourMap) {
  // The documented ends, white at 0, linear in between, clamped outside.
  EXPECT_TRUE(same(diverging_colour(-1), Rgb{33, 102, 172}));
  EXPECT_TRUE(same(diverging_colour(0), kWhite));
  EXPECT_TRUE(same(diverging_colour(1), Rgb{178, 24, 43}));
  EXPECT_TRUE(same(diverging_colour(0.5), Rgb{217, 140, 149}));  // (255 + 178) / 2 = 216.5, ...
  EXPECT_TRUE(
      same(diverging_colour(-0.25), Rgb{200, 217, 234}));  // 255 - 0.25 (255 - 33) = 199.5, ...
  EXPECT_TRUE(same(diverging_colour(7), diverging_colour(1)));
  EXPECT_TRUE(same(diverging_colour(NAN), kGrey));
}

// Each cell has the colour map's colour of its value, row i from the top and
// column j from the left; the colour bar follows the same map.
TEST(Heatmap, CellsAndColourBarShowTheValues) {
  Heatmap h;
  h.title = "cells";
  h.n = 5;
  for (int i = 0; i < 5; ++i) {
    for (int j = 0; j < 5; ++j) h.values.push_back(static_cast<float>(-1 + 0.1 * i + 0.37 * j));
  }
  h.values[7] = NAN;
  h.last = 4;
  const auto path = out_file("heatmap", ".png");
  write_heatmap(path, h);
  const readback::PngImage img = read_png(path);
  const PixelBox cells = heatmap_cells(h.n), bar = heatmap_colour_bar(h.n);
  ASSERT_EQ(cells.w % 5, 0);
  ASSERT_GE(cells.w, 512);
  ASSERT_LT(bar.x + bar.w, img.width);
  ASSERT_LT(cells.y + cells.h, img.height);
  const int side = cells.w / 5;
  for (int i = 0; i < 5; ++i) {
    for (int j = 0; j < 5; ++j) {
      const Rgb want = diverging_colour(h.values[static_cast<std::size_t>(i * 5 + j)]);
      // The whole cell, not just its centre, corners included.
      for (const int dy : {0, side / 2, side - 1}) {
        for (const int dx : {0, side / 2, side - 1}) {
          ASSERT_TRUE(same(img.at(cells.x + j * side + dx, cells.y + i * side + dy), want))
              << "cell " << i << ", " << j;
        }
      }
    }
  }
  // The bar is a linear gradient: within 2 of the map at each pixel row's centre.
  for (int row = 0; row < bar.h; row += 7) {
    const double v = 1 - 2 * (row + 0.5) / bar.h;
    EXPECT_LE(distance(img.at(bar.x + bar.w / 2, bar.y + row), diverging_colour(v)), 2) << row;
  }
  std::filesystem::remove(path);
}

TEST(Heatmap, WritesAWellFormedSvgAndRejectsBadShapes) {
  Heatmap h;
  h.n = 3;
  h.values.assign(9, 0.5f);
  h.last = 2;
  const auto path = out_file("heatmap", ".svg");
  write_heatmap(path, h);
  const readback::SvgSummary svg = read_svg(path);
  EXPECT_EQ(svg.root, "http://www.w3.org/2000/svg|svg");
  EXPECT_EQ(svg.count("image"), 1);           // the cells, one embedded image
  EXPECT_EQ(svg.count("linearGradient"), 1);  // the colour bar
  EXPECT_EQ(svg.count("stop"), 3);            // blue, white, red
  std::filesystem::remove(path);
  h.values.pop_back();
  EXPECT_THROW(write_heatmap(path, h), Error);
  h.n = 0;
  h.values.clear();
  EXPECT_THROW(write_heatmap(path, h), Error);
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace posembed::tools
