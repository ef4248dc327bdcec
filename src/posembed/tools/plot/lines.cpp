#include <algorithm>
#include <cmath>

#include "posembed/core/error.h"
#include "posembed/tools/format.h"
#include "posembed/tools/plot.h"
#include "posembed/tools/plot/canvas.h"

namespace posembed::tools {
namespace {

using namespace canvas;

constexpr Rgb kBlue{33, 102, 172}, kRed{178, 24, 43};  // the diverging map's ends

// ---- Line plots

// A log axis over more decades than this gets ticks at the powers of ten only
// (more than ~10 ticks crowd a 300-pixel axis).
constexpr double kDenseDecades = 3;

// "10^{k}" or "m×10^{k}".
std::string power_label(double v) {
  const int k = static_cast<int>(std::floor(std::log10(std::abs(v)) + 1e-9));
  const double m = v / std::pow(10.0, k);
  if (std::abs(std::abs(m) - 1) < 1e-9) return format("%s10^{%d}", m < 0 ? "-" : "", k);
  return format("%g×10^{%d}", m, k);
}

// Ticks on a log axis: 1, 2, 5 x 10^k inside [lo, hi]; only powers of ten over
// more than kDenseDecades; the ends when nothing else falls inside.
std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> ticks;
  const bool sparse = std::log10(hi / lo) > kDenseDecades;
  for (double decade = std::pow(10.0, std::floor(std::log10(lo))); decade <= hi; decade *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (sparse && m != 1.0) continue;
      const double t = m * decade;
      if (t >= lo * (1 - 1e-9) && t <= hi * (1 + 1e-9)) ticks.push_back(t);
    }
  }
  if (ticks.size() < 2) ticks = {lo, hi};
  return ticks;
}

struct Axis {
  bool log = false;
  double lo = 0, hi = 1;  // the data range shown
  double p0 = 0, p1 = 1;  // pixels of lo and hi
  std::vector<AxisTick> ticks;
  double f(double v) const { return log ? std::log10(v) : v; }
  double pixel(double v) const { return p0 + (f(v) - f(lo)) / (f(hi) - f(lo)) * (p1 - p0); }
};

// axis_ticks, or the given values inside [lo, hi] labelled the same way.
std::vector<AxisTick> make_ticks(bool log, double lo, double hi, std::vector<double> values) {
  if (values.empty()) values = log ? log_ticks(lo, hi) : nice_ticks(lo, hi, 8);
  const auto outside = [](double v) { return std::abs(v) >= 1e5 || std::abs(v) < 1e-3; };
  const bool powers = log && (std::log10(hi / lo) > kDenseDecades || outside(lo) || outside(hi));
  const double slack = 1e-9 * std::abs(hi - lo);
  std::vector<AxisTick> ticks;
  for (double t : values) {
    if (t < lo - slack || t > hi + slack) continue;
    std::string label = t == 0 ? "0" : powers || outside(t) ? power_label(t) : format("%g", t);
    ticks.push_back({t, label});
  }
  return ticks;
}

void check_series(const PlotSeries& s, const LinePlot& plot) {
  if (s.x.size() != s.y.size()) {
    throw Error("plot '" + plot.title + "': series '" + s.label + "' has " +
                std::to_string(s.x.size()) + " x values but " + std::to_string(s.y.size()) +
                " y values");
  }
  if ((!s.y_lo.empty() || !s.y_hi.empty()) &&
      (s.y_lo.size() != s.x.size() || s.y_hi.size() != s.x.size())) {
    throw Error("plot '" + plot.title + "': series '" + s.label +
                "' needs one band value (y_lo, y_hi) per x value or none");
  }
}

bool finite_point(const PlotSeries& s, std::size_t i) {
  return std::isfinite(s.x[i]) && std::isfinite(s.y[i]);
}

struct Range {
  double lo, hi;
};

// The x and y ranges shown, from the finite data (log axes: positive data only,
// else an error) and the plot's y_min, y_max.
std::pair<Range, Range> data_ranges(const LinePlot& plot) {
  if (plot.width < 200 || plot.height < 150) {
    throw Error("plot '" + plot.title + "' must be at least 200 x 150 pixels, not " +
                std::to_string(plot.width) + " x " + std::to_string(plot.height));
  }
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  const auto take_y = [&](double v) {
    if (!std::isfinite(v)) return;
    if (plot.log_y && v <= 0) {
      throw Error("plot '" + plot.title + "': y value " + std::to_string(v) +
                  " cannot be shown on a log axis");
    }
    y_lo = std::min(y_lo, v);
    y_hi = std::max(y_hi, v);
  };
  for (const PlotSeries& s : plot.series) {
    check_series(s, plot);
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (!finite_point(s, i)) continue;
      if (plot.log_x && s.x[i] <= 0) {
        throw Error("plot '" + plot.title + "': x value " + std::to_string(s.x[i]) +
                    " cannot be shown on a log axis");
      }
      x_lo = std::min(x_lo, s.x[i]);
      x_hi = std::max(x_hi, s.x[i]);
      take_y(s.y[i]);
      if (!s.y_lo.empty()) {
        take_y(s.y_lo[i]);
        take_y(s.y_hi[i]);
      }
    }
  }
  if (!(x_lo <= x_hi)) throw Error("plot '" + plot.title + "' has no finite points to draw");
  if (std::isfinite(plot.y_min)) y_lo = plot.y_min;
  if (std::isfinite(plot.y_max)) y_hi = plot.y_max;
  if (!(y_lo < y_hi)) {  // one value, or an inverted range: widen around it
    const double mid = std::isfinite(y_lo) ? y_lo : 1.0;
    y_lo = plot.log_y ? mid / 2 : mid - 1;
    y_hi = plot.log_y ? mid * 2 : mid + 1;
  }
  if (x_lo == x_hi) {
    x_lo = plot.log_x ? x_lo / 2 : x_lo - 1;
    x_hi = plot.log_x ? x_hi * 2 : x_hi + 1;
  }
  if (!std::isfinite(plot.y_min) && !std::isfinite(plot.y_max)) {  // a margin around the data
    if (plot.log_y) {
      y_lo /= 1.1;
      y_hi *= 1.1;
    } else {
      const double pad = 0.04 * (y_hi - y_lo);
      y_lo -= pad;
      y_hi += pad;
    }
  }
  return {{x_lo, x_hi}, {y_lo, y_hi}};
}

struct PlotLayout {
  PixelBox frame;
  Axis x, y;
};

// Margins around the frame of a plot whose top-left corner is (ox, oy): the
// title above, the y tick labels (as wide as the widest) and the rotated y
// label on the left, the x tick labels and x label below.
PlotLayout layout_plot(cairo_t* cr, const LinePlot& plot, int ox, int oy) {
  const auto [xr, yr] = data_ranges(plot);
  PlotLayout l;
  l.x.log = plot.log_x;
  l.x.lo = xr.lo;
  l.x.hi = xr.hi;
  l.x.ticks = make_ticks(plot.log_x, xr.lo, xr.hi, plot.x_ticks);
  l.y.log = plot.log_y;
  l.y.lo = yr.lo;
  l.y.hi = yr.hi;
  l.y.ticks = make_ticks(plot.log_y, yr.lo, yr.hi, {});
  double label_w = 0;
  for (const AxisTick& t : l.y.ticks) {
    label_w = std::max(label_w, text_width(cr, t.label, kTickFont));
  }
  const int left = 32 + static_cast<int>(std::ceil(label_w)) + 8, right = 24, top = 44, bottom = 56;
  l.frame = {ox + left, oy + top, plot.width - left - right, plot.height - top - bottom};
  l.x.p0 = l.frame.x;
  l.x.p1 = l.frame.x + l.frame.w;
  l.y.p0 = l.frame.y + l.frame.h;
  l.y.p1 = l.frame.y;
  return l;
}

Rgb light(Rgb c) {
  return {lerp(c.r, 255, 0.78), lerp(c.g, 255, 0.78), lerp(c.b, 255, 0.78)};
}

// Calls f(begin, end) for each maximal run [begin, end) of indices where ok(i).
template <class Ok, class F>
void for_each_run(std::size_t n, Ok ok, F f) {
  std::size_t i = 0;
  while (i < n) {
    if (!ok(i)) {
      ++i;
      continue;
    }
    std::size_t end = i;
    while (end < n && ok(end)) ++end;
    f(i, end);
    i = end;
  }
}

void set_line_style(cairo_t* cr, const PlotSeries& s) {
  set_colour(cr, s.colour);
  cairo_set_line_width(cr, 2);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  const double dash[] = {7, 5};
  cairo_set_dash(cr, dash, s.dashed ? 2 : 0, 0);
}

void draw_marker(cairo_t* cr, double x, double y, Rgb c) {
  set_colour(cr, c);
  cairo_new_sub_path(cr);
  cairo_arc(cr, x, y, 3.2, 0, 2 * M_PI);
  cairo_fill(cr);
}

// Bands and lines, clipped to the frame.
void draw_lines(cairo_t* cr, const PlotLayout& l, const LinePlot& plot) {
  const PixelBox& f = l.frame;
  cairo_save(cr);
  cairo_rectangle(cr, f.x, f.y, f.w, f.h);
  cairo_clip(cr);
  // Bands first (light), then the lines on top.
  for (const PlotSeries& s : plot.series) {
    if (s.y_lo.empty()) continue;
    set_colour(cr, light(s.colour));
    const auto ok = [&](std::size_t i) {
      return std::isfinite(s.x[i]) && std::isfinite(s.y_lo[i]) && std::isfinite(s.y_hi[i]);
    };
    for_each_run(s.x.size(), ok, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) {  // along the top, back along the bottom
        cairo_line_to(cr, l.x.pixel(s.x[i]), l.y.pixel(s.y_hi[i]));
      }
      for (std::size_t i = e; i-- > b;) {
        cairo_line_to(cr, l.x.pixel(s.x[i]), l.y.pixel(s.y_lo[i]));
      }
      cairo_close_path(cr);
      cairo_fill(cr);
    });
  }
  for (const PlotSeries& s : plot.series) {
    set_line_style(cr, s);
    for_each_run(
        s.x.size(), [&](std::size_t i) { return finite_point(s, i); },
        [&](std::size_t b, std::size_t e) {
          for (std::size_t i = b; i < e; ++i) {
            cairo_line_to(cr, l.x.pixel(s.x[i]), l.y.pixel(s.y[i]));
          }
          cairo_stroke(cr);
        });
  }
  cairo_restore(cr);
}

// Markers are not clipped and go over the frame, so a point on the frame shows
// whole; points outside the y range are not drawn.
void draw_markers(cairo_t* cr, const PlotLayout& l, const LinePlot& plot) {
  for (const PlotSeries& s : plot.series) {
    if (!s.markers) continue;
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (!finite_point(s, i) || s.y[i] < l.y.lo || s.y[i] > l.y.hi) continue;
      draw_marker(cr, l.x.pixel(s.x[i]), l.y.pixel(s.y[i]), s.colour);
    }
  }
}

// How much of the plotted data a box (grown by a marker's radius) would hide:
// the points and 8 samples along each line segment inside it.
long data_under(const PlotLayout& l, const LinePlot& plot, const PixelBox& b) {
  const auto inside = [&](double px, double py) {
    return px >= b.x - 4 && px <= b.x + b.w + 4 && py >= b.y - 4 && py <= b.y + b.h + 4;
  };
  long count = 0;
  for (const PlotSeries& s : plot.series) {
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (!finite_point(s, i)) continue;
      const double px = l.x.pixel(s.x[i]), py = l.y.pixel(s.y[i]);
      count += inside(px, py);
      if (i == 0 || !finite_point(s, i - 1)) continue;
      const double qx = l.x.pixel(s.x[i - 1]), qy = l.y.pixel(s.y[i - 1]);
      for (int k = 1; k < 8; ++k) count += inside(qx + (px - qx) * k / 8, qy + (py - qy) * k / 8);
    }
  }
  return count;
}

// The legend in the corner of the frame that hides the least data.
void draw_legend(cairo_t* cr, const PlotLayout& l, const LinePlot& plot) {
  double label_w = 0;
  int entries = 0;
  for (const PlotSeries& s : plot.series) {
    if (s.label.empty()) continue;
    label_w = std::max(label_w, text_width(cr, s.label, kTickFont));
    ++entries;
  }
  if (entries == 0) return;
  const PixelBox& f = l.frame;
  const int row_h = 18, box_w = static_cast<int>(std::ceil(label_w)) + 46,
            box_h = entries * row_h + 8;
  const int corners[4][2] = {{f.x + f.w - 10 - box_w, f.y + 10},
                             {f.x + 10, f.y + 10},
                             {f.x + f.w - 10 - box_w, f.y + f.h - 10 - box_h},
                             {f.x + 10, f.y + f.h - 10 - box_h}};
  int best = 0;
  long best_count = -1;
  for (int k = 0; k < 4; ++k) {
    const long count = data_under(l, plot, {corners[k][0], corners[k][1], box_w, box_h});
    if (best_count < 0 || count < best_count) {
      best = k;
      best_count = count;
    }
  }
  const PixelBox box{corners[best][0], corners[best][1], box_w, box_h};
  set_colour(cr, kWhite);
  cairo_rectangle(cr, box.x, box.y, box.w, box.h);
  cairo_fill(cr);
  frame(cr, box, kGrey);
  int row = 0;
  for (const PlotSeries& s : plot.series) {
    if (s.label.empty()) continue;
    const double y = box.y + 4 + row_h * (row + 0.5);
    set_line_style(cr, s);
    cairo_move_to(cr, box.x + 8, y);
    cairo_line_to(cr, box.x + 32, y);
    cairo_stroke(cr);
    cairo_set_dash(cr, nullptr, 0, 0);
    if (s.markers) draw_marker(cr, box.x + 20, y, s.colour);
    draw_text(cr, box.x + 38, y + 4, s.label, kTickFont, Align::left);
    ++row;
  }
}

void draw_line_plot(cairo_t* cr, const LinePlot& plot, int ox, int oy) {
  const PlotLayout l = layout_plot(cr, plot, ox, oy);
  const PixelBox& f = l.frame;
  draw_text(cr, f.x, oy + 27, plot.title,
            fitted(cr, plot.title, kTitleFont, ox + plot.width - f.x - 8), Align::left);
  for (const AxisTick& t : l.x.ticks) {
    const double px = std::round(l.x.pixel(t.value));
    hairline(cr, px, f.y, px, f.y + f.h - 1, kLightGrey);
    hairline(cr, px, f.y + f.h, px, f.y + f.h + 4, kBlack);
    draw_text(cr, px + 0.5, f.y + f.h + 18, t.label, kTickFont, Align::centre);
  }
  for (const AxisTick& t : l.y.ticks) {
    const double py = std::round(l.y.pixel(t.value));
    hairline(cr, f.x, py, f.x + f.w - 1, py, kLightGrey);
    hairline(cr, f.x - 5, py, f.x - 1, py, kBlack);
    draw_text(cr, f.x - 8, py + 4.5, t.label, kTickFont, Align::right);
  }
  draw_text(cr, f.x + f.w / 2.0, f.y + f.h + 42, plot.x_label, kLabelFont, Align::centre);
  draw_text_up(cr, ox + 20, f.y + f.h / 2.0, plot.y_label, kLabelFont);
  draw_lines(cr, l, plot);
  frame(cr, f, kBlack);
  draw_markers(cr, l, plot);
  draw_legend(cr, l, plot);
}

constexpr int kFigureTitleHeight = 36;

}  // namespace

Rgb diverging_colour(double v) {
  if (std::isnan(v)) return kGrey;
  v = std::clamp(v, -1.0, 1.0);
  const Rgb& end = v < 0 ? kBlue : kRed;
  const double t = std::abs(v);
  return {lerp(255, end.r, t), lerp(255, end.g, t), lerp(255, end.b, t)};
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  std::vector<double> ticks;
  if (!(hi > lo) || target < 1) return {lo};
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  for (double t = std::ceil(lo / step - 1e-9) * step; t <= hi + step * 1e-9; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

Rgb series_colour(int i) {
  // ColorBrewer-like dark hues that stay apart on white and in grey print.
  static constexpr Rgb kColours[] = {{33, 102, 172},  {178, 24, 43},  {27, 120, 55},
                                     {230, 120, 0},   {118, 42, 131}, {0, 150, 150},
                                     {110, 110, 110}, {200, 60, 160}};
  constexpr int n = sizeof kColours / sizeof kColours[0];
  return kColours[((i % n) + n) % n];
}

ImageFormat image_format(const std::filesystem::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".png") return ImageFormat::png;
  if (ext == ".svg") return ImageFormat::svg;
  throw Error("plot file " + path.string() + " must end in .png or .svg (the format to write)");
}

std::vector<AxisTick> axis_ticks(bool log, double lo, double hi) {
  return make_ticks(log, lo, hi, {});
}

PixelBox line_plot_frame(const LinePlot& plot) {
  return with_scratch_context([&](cairo_t* cr) { return layout_plot(cr, plot, 0, 0).frame; });
}


void write_line_plot(const std::filesystem::path& path, const LinePlot& plot) {
  write_line_plots(path, std::span<const LinePlot>(&plot, 1), "");
}

void write_line_plots(const std::filesystem::path& path, std::span<const LinePlot> panels,
                      const std::string& title) {
  if (panels.empty()) throw Error("no plots to write to " + path.string());
  const int title_h = title.empty() ? 0 : kFigureTitleHeight;
  int width = 0, height = title_h;
  for (const LinePlot& p : panels) {
    width = std::max(width, p.width);
    height += p.height;
  }
  render(path, width, height, [&](cairo_t* cr) {
    if (!title.empty()) {
      draw_text(cr, 14, 26, title, fitted(cr, title, kFigureTitleFont, width - 28), Align::left);
    }
    int oy = title_h;
    for (const LinePlot& p : panels) {
      draw_line_plot(cr, p, 0, oy);
      oy += p.height;
    }
  });
}

}  // namespace posembed::tools
