// The tools' plots: line plots (alone or stacked in panels) and a heatmap,
// drawn with cairo (anti-aliased lines, DejaVu Sans text) and written as PNG
// (8-bit RGB) or SVG, chosen by the file name's extension (.png or .svg).
//
// Text in titles, labels and legends may carry sub- and superscripts:
//   ^{...} and _{...}   superscript, subscript (s_{k}, 10^{-3})
//   ^ and digits        superscript of a signed number without braces (T^2, 10^-3)
// Anything else, underscores included (wpe.weight, init_scale), prints as written.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace posembed::tools {

struct Rgb {
  std::uint8_t r = 0, g = 0, b = 0;
};

inline constexpr Rgb kWhite{255, 255, 255};
inline constexpr Rgb kBlack{0, 0, 0};
inline constexpr Rgb kGrey{160, 160, 160};
inline constexpr Rgb kLightGrey{225, 225, 225};

// -1 -> dark blue (33, 102, 172), 0 -> white, +1 -> dark red (178, 24, 43),
// linear in RGB in between (ColorBrewer RdBu's ends); values outside are
// clamped, NaN is grey.
Rgb diverging_colour(double value);

// Axis tick values: a 1/2/5 x 10^k step giving about `target` ticks in [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int target);

// The ticks of a line plot's axis showing [lo, hi]: 1/2/5 x 10^k steps on a
// linear axis; 1, 2, 5 x 10^k on a log axis (only the powers of ten over more
// than 3 decades). Labels are "%g" numbers, or in powers of ten ("10^{-3}",
// "2×10^{5}") beyond 1e-3..1e5, and on a log axis over more than 3 decades or
// reaching beyond 1e-3..1e5 all of them are.
struct AxisTick {
  double value = 0;
  std::string label;
};
std::vector<AxisTick> axis_ticks(bool log, double lo, double hi);

// Distinguishable line colours for plot series i = 0, 1, ... (cycling after 8).
Rgb series_colour(int i);

enum class ImageFormat { png, svg };
// From the extension, ".png" or ".svg"; throws posembed::Error otherwise.
ImageFormat image_format(const std::filesystem::path& path);

// A line plot: several series on shared axes (linear or log), an optional
// shaded band per series (e.g. the min..max over seeds), a legend in the
// corner that hides the least data. Non-finite points break a line; they are
// not drawn. Lines and bands beyond y_min..y_max are cut at the frame.
struct PlotSeries {
  std::string label;  // empty: not in the legend
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
  int width = 900, height = 540;  // pixels (SVG: px units)
};

// Throws posembed::Error on an empty plot, series whose x, y (or band) sizes
// differ, non-positive values on a log axis, a file name that is neither .png
// nor .svg, or a file that cannot be written (the file is then left as it was).
void write_line_plot(const std::filesystem::path& path, const LinePlot& plot);

// Several plots stacked top to bottom in one image under a common title; the
// image is as wide as the widest panel. The same errors as write_line_plot.
void write_line_plots(const std::filesystem::path& path, std::span<const LinePlot> panels,
                      const std::string& title);

// A square heatmap of values in [-1, 1] in the diverging colours, with a
// colour bar. Cell (i, j) is row i from the top, column j from the left.
struct Heatmap {
  std::string title, axis_label, value_label;
  std::int64_t n = 0;         // (n, n) cells
  std::vector<float> values;  // (n, n) row-major
  double step = 1;            // cell i stands for position i * step
  double last = 0;            // the largest position, the end of the axis ticks
};
// Throws posembed::Error when n is outside 1..4096 or values are not n x n,
// and as write_line_plot for the file.
void write_heatmap(const std::filesystem::path& path, const Heatmap& heatmap);

// Where things land in the image, in pixels, for callers and tests that read
// pixels back: [x, x + w) x [y, y + h).
struct PixelBox {
  int x = 0, y = 0, w = 0, h = 0;
};
// The data area of a line plot written alone: the frame's inside edges. A
// point (x, y) lands at x + w * t_x, y + h * (1 - t_y), with t the value's
// fraction of the axis range (of log10 values on a log axis).
PixelBox line_plot_frame(const LinePlot& plot);
// The cells of a heatmap of n x n: cell (i, j) fills the square of side
// w / n at (x + j w / n, y + i w / n).
PixelBox heatmap_cells(std::int64_t n);
// The colour bar: +1 at the top row, -1 at the bottom row, linear between.
PixelBox heatmap_colour_bar(std::int64_t n);

}  // namespace posembed::tools
