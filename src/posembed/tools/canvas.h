// A small RGB drawing surface for the tools' plots, written to PNG by libpng.
// Text uses a built-in 5x7 bitmap font (digits, upper-case letters and a few
// signs; lower-case letters are drawn upper-case).
#pragma once

#include <cstdint>
#include <cmath>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace posembed::tools {

struct Rgb {
  std::uint8_t r = 0, g = 0, b = 0;
};

inline constexpr Rgb kWhite{255, 255, 255};
inline constexpr Rgb kBlack{0, 0, 0};
inline constexpr Rgb kGrey{160, 160, 160};
inline constexpr Rgb kLightGrey{225, 225, 225};

// -1 -> blue, 0 -> white, +1 -> red (values outside are clamped).
Rgb diverging_colour(double value);

class Canvas {
 public:
  Canvas(int width, int height, Rgb background = kWhite);
  int width() const { return width_; }
  int height() const { return height_; }
  void set(int x, int y, Rgb c);  // ignores points outside
  void fill_rect(int x0, int y0, int x1, int y1, Rgb c);  // [x0, x1) x [y0, y1)
  void line(int x0, int y0, int x1, int y1, Rgb c);       // Bresenham, inclusive
  void dashed_hline(int x0, int x1, int y, Rgb c);
  // Text with its top-left corner at (x, y); scale 1 is 5x7 pixels per glyph and
  // 6 pixels of advance. Returns the width drawn.
  int text(int x, int y, std::string_view s, Rgb c, int scale = 1);
  int text_vertical(int x, int y, std::string_view s, Rgb c, int scale = 1);  // bottom to top
  static int text_width(std::string_view s, int scale = 1) {
    return static_cast<int>(s.size()) * 6 * scale - scale;
  }
  // Throws posembed::Error when the file cannot be written.
  void write_png(const std::filesystem::path& path) const;

 private:
  int width_, height_;
  std::vector<std::uint8_t> pixels_;  // (height, width, 3)
};

// Axis tick values: a 1/2/5 x 10^k step giving about `target` ticks in [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int target);

// Distinguishable line colours for plot series i = 0, 1, ... (cycling after 8).
Rgb series_colour(int i);

// A line plot: several series on shared axes (linear or log), an optional
// shaded band per series (e.g. the min..max over seeds), a legend.
// Non-finite points break a line; they are not drawn.
struct PlotSeries {
  std::string label;
  Rgb colour{};
  std::vector<double> x, y;
  std::vector<double> y_lo, y_hi;  // empty, or one per x: the band drawn under the line
  bool markers = false;            // a dot on each point
  bool dashed = false;
};
struct LinePlot {
  std::string title, x_label, y_label;
  bool log_x = false, log_y = false;
  double y_min = NAN, y_max = NAN;  // NaN: from the data (all of it, bands included)
  std::vector<double> x_ticks;      // empty: automatic
  std::vector<PlotSeries> series;
  int width = 900, height = 540;
};
// Throws posembed::Error on an empty plot, series whose x, y (or band) sizes
// differ, non-positive values on a log axis, or a file that cannot be written.
void write_line_plot_png(const std::filesystem::path& path, const LinePlot& plot);

}  // namespace posembed::tools
