#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "posembed/core/error.h"
#include "posembed/tools/canvas.h"

namespace posembed::tools {
namespace {

std::filesystem::path temp_png(const char* name) {
  std::filesystem::path p = std::filesystem::temp_directory_path() / "posembed_plot_";
  p += name;
  p += ".png";
  return p;
}

LinePlot two_series() {
  // Move-assigned strings: GCC 12 warns falsely (-Wrestrict, PR105651) on
  // assigning a literal to a std::string member here.
  LinePlot p;
  p.title = std::string("TEST PLOT");
  p.x_label = std::string("X AXIS");
  p.y_label = std::string("Y AXIS");
  p.series.push_back({"A", series_colour(0), {1, 2, 3}, {3, 2, 1}, {2.5, 1.5, 0.5}, {3.5, 2.5, 1.5}, true, false});
  p.series.push_back({"B", series_colour(1), {1, 3}, {1, 4}, {}, {}, false, true});
  return p;
}

// PNG width and height from the IHDR chunk (bytes 16..23, big endian).
std::pair<int, int> png_size(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  unsigned char h[24] = {};
  f.read(reinterpret_cast<char*>(h), 24);
  const auto be = [&](int i) { return (h[i] << 24) | (h[i + 1] << 16) | (h[i + 2] << 8) | h[i + 3]; };
  return {be(16), be(20)};
}

TEST(LinePlot, WritesAPngOfTheRequestedSize) {
  LinePlot p = two_series();
  p.width = 640;
  p.height = 300;
  const auto path = temp_png("size");
  write_line_plot_png(path, p);
  EXPECT_EQ(png_size(path), std::make_pair(640, 300));
  p.log_x = p.log_y = true;  // all values positive: fine on log axes
  write_line_plot_png(path, p);
  std::filesystem::remove(path);
}

TEST(LinePlot, RejectsBadInput) {
  const auto path = temp_png("bad");
  LinePlot p = two_series();
  p.series[1].y.pop_back();
  EXPECT_THROW(write_line_plot_png(path, p), Error);  // x and y sizes differ
  p = two_series();
  p.series[0].y_lo.pop_back();
  EXPECT_THROW(write_line_plot_png(path, p), Error);  // band size differs
  p = two_series();
  p.series[0].y[0] = 0;
  p.log_y = true;
  EXPECT_THROW(write_line_plot_png(path, p), Error);  // 0 on a log axis
  p = two_series();
  for (auto& s : p.series) std::fill(s.y.begin(), s.y.end(), NAN);
  EXPECT_THROW(write_line_plot_png(path, p), Error);  // nothing finite to draw
  EXPECT_THROW(write_line_plot_png("/nonexistent-dir/x.png", two_series()), Error);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(LinePlot, SeriesColoursDifferAndCycle) {
  for (int i = 0; i < 8; ++i) {
    for (int j = i + 1; j < 8; ++j) {
      const Rgb a = series_colour(i), b = series_colour(j);
      EXPECT_FALSE(a.r == b.r && a.g == b.g && a.b == b.b) << i << " " << j;
    }
  }
  EXPECT_EQ(series_colour(9).r, series_colour(1).r);
}

}  // namespace
}  // namespace posembed::tools
