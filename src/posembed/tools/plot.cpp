#include "posembed/tools/plot.h"

#include <cairo-svg.h>
#include <cairo.h>
#include <fontconfig/fontconfig.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string_view>

#include "posembed/core/error.h"
#include "posembed/tools/format.h"

namespace posembed::tools {
namespace {

constexpr Rgb kBlue{33, 102, 172}, kRed{178, 24, 43};  // the diverging map's ends

std::uint8_t lerp(std::uint8_t a, std::uint8_t b, double t) {
  return static_cast<std::uint8_t>(std::lround(a + (b - a) * t));
}

void set_colour(cairo_t* cr, Rgb c) {
  cairo_set_source_rgb(cr, c.r / 255.0, c.g / 255.0, c.b / 255.0);
}

// ---- Text: DejaVu Sans through cairo's toy font API (fontconfig finds the
// file), with sub- and superscript runs. The toy API is enough for one-line
// labels in one script and keeps pango, glib and harfbuzz out of the build.

struct Font {
  double size = 11;
  bool bold = false;
};
constexpr Font kTitleFont{15, true}, kFigureTitleFont{17, true}, kLabelFont{12.5, false},
    kTickFont{11, false};

struct Run {
  std::string text;
  int shift = 0;  // +1 superscript, -1 subscript
};

std::vector<Run> parse_markup(std::string_view s) {
  std::vector<Run> runs;
  const auto add = [&](std::string_view t, int shift) {
    if (t.empty()) return;
    if (runs.empty() || runs.back().shift != shift) runs.push_back({std::string(), shift});
    runs.back().text += t;
  };
  std::size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if ((c == '^' || c == '_') && i + 1 < s.size() && s[i + 1] == '{') {
      const std::size_t close = s.find('}', i + 2);
      if (close != std::string_view::npos) {
        add(s.substr(i + 2, close - i - 2), c == '^' ? 1 : -1);
        i = close + 1;
        continue;
      }
    }
    if (c == '^') {  // ^2, ^-3: a signed number
      std::size_t end = i + 1;
      if (end < s.size() && (s[end] == '-' || s[end] == '+')) ++end;
      const std::size_t digits = end;
      while (end < s.size() && std::isdigit(static_cast<unsigned char>(s[end]))) ++end;
      if (end > digits) {
        add(s.substr(i + 1, end - i - 1), 1);
        i = end;
        continue;
      }
    }
    add(s.substr(i, 1), 0);
    ++i;
  }
  return runs;
}

double run_size(Font f, const Run& r) {
  return r.shift == 0 ? f.size : 0.7 * f.size;
}
double run_rise(Font f, const Run& r) {
  return r.shift > 0 ? -0.42 * f.size : r.shift < 0 ? 0.22 * f.size : 0.0;
}

void select_font(cairo_t* cr, Font f) {
  cairo_select_font_face(cr, "DejaVu Sans", CAIRO_FONT_SLANT_NORMAL,
                         f.bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
}

double text_width(cairo_t* cr, std::string_view s, Font f) {
  select_font(cr, f);
  double w = 0;
  for (const Run& r : parse_markup(s)) {
    cairo_set_font_size(cr, run_size(f, r));
    cairo_text_extents_t e;
    cairo_text_extents(cr, r.text.c_str(), &e);
    w += e.x_advance;
  }
  return w;
}

// The font shrunk (down to 8 px) so that s fits in max_width.
Font fitted(cairo_t* cr, std::string_view s, Font f, double max_width) {
  const double w = text_width(cr, s, f);
  if (w > max_width && w > 0) f.size = std::max(8.0, f.size * max_width / w);
  return f;
}

enum class Align { left, centre, right };

// s with its baseline at y, starting at, centred on or ending at x.
void draw_text(cairo_t* cr, double x, double y, std::string_view s, Font f, Align align) {
  if (align != Align::left) x -= text_width(cr, s, f) / (align == Align::centre ? 2 : 1);
  select_font(cr, f);
  set_colour(cr, kBlack);
  for (const Run& r : parse_markup(s)) {
    cairo_set_font_size(cr, run_size(f, r));
    cairo_move_to(cr, x, y + run_rise(f, r));
    cairo_show_text(cr, r.text.c_str());
    cairo_text_extents_t e;
    cairo_text_extents(cr, r.text.c_str(), &e);
    x += e.x_advance;
  }
}

// Reading upwards, centred on (x, y) along the text, baseline at x.
void draw_text_up(cairo_t* cr, double x, double y, std::string_view s, Font f) {
  cairo_save(cr);
  cairo_translate(cr, x, y);
  cairo_rotate(cr, -M_PI / 2);
  draw_text(cr, 0, 0, s, f, Align::centre);
  cairo_restore(cr);
}

// A 1-pixel line between pixel centres, crisp on integer coordinates.
void hairline(cairo_t* cr, double x0, double y0, double x1, double y1, Rgb c) {
  set_colour(cr, c);
  cairo_set_line_width(cr, 1);
  cairo_move_to(cr, x0 + 0.5, y0 + 0.5);
  cairo_line_to(cr, x1 + 0.5, y1 + 0.5);
  cairo_stroke(cr);
}

// A 1-pixel frame just outside the box.
void frame(cairo_t* cr, const PixelBox& b, Rgb c) {
  set_colour(cr, c);
  cairo_set_line_width(cr, 1);
  cairo_rectangle(cr, b.x - 0.5, b.y - 0.5, b.w + 1, b.h + 1);
  cairo_stroke(cr);
}

// ---- Surfaces and files

// cairo and fontconfig keep their font caches for the life of the process. The
// sanitizer build frees them at exit (what cairo_debug_reset_static_data is
// for), so that LeakSanitizer reports only real leaks; elsewhere they are left
// alone, as another library in the process may still use them while it exits.
void free_font_caches_at_exit() {
#ifdef POSEMBED_SANITIZE
  static const int once = std::atexit([] {
    cairo_debug_reset_static_data();
    FcFini();
  });
  (void)once;
#endif
}

using SurfacePtr = std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)>;
using ContextPtr = std::unique_ptr<cairo_t, decltype(&cairo_destroy)>;

SurfacePtr image_surface(int width, int height) {
  return {cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height), &cairo_surface_destroy};
}

cairo_status_t append_bytes(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

void check_cairo(cairo_status_t status, const std::filesystem::path& path) {
  if (status != CAIRO_STATUS_SUCCESS) {
    throw Error("cairo failed drawing " + path.string() + ": " + cairo_status_to_string(status));
  }
}

// A temporary file beside the target, renamed over it: a failure leaves the
// target as it was.
void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw Error("cannot write " + path.string() +
                  ": check that the directory exists and is writable");
    }
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      throw Error("writing " + path.string() + " failed (disk full?)");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw Error("cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message());
  }
}

// Draws on a white width x height surface of the path's format and writes the
// file. Errors from `draw` (bad plot data) leave no file behind.
void render(const std::filesystem::path& path, int width, int height,
            const std::function<void(cairo_t*)>& draw) {
  const ImageFormat format = image_format(path);
  free_font_caches_at_exit();
  std::string bytes;
  SurfacePtr surface =
      format == ImageFormat::png
          ? image_surface(width, height)
          : SurfacePtr(cairo_svg_surface_create_for_stream(append_bytes, &bytes, width, height),
                       &cairo_surface_destroy);
  check_cairo(cairo_surface_status(surface.get()), path);
  if (format == ImageFormat::svg) {
    cairo_svg_surface_set_document_unit(surface.get(), CAIRO_SVG_UNIT_PX);
  }
  {
    const ContextPtr cr(cairo_create(surface.get()), &cairo_destroy);
    set_colour(cr.get(), kWhite);
    cairo_paint(cr.get());
    draw(cr.get());
    check_cairo(cairo_status(cr.get()), path);
  }
  if (format == ImageFormat::png) {
    check_cairo(cairo_surface_write_to_png_stream(surface.get(), append_bytes, &bytes), path);
  } else {
    cairo_surface_finish(surface.get());  // flushes the SVG into `bytes`
    check_cairo(cairo_surface_status(surface.get()), path);
  }
  write_file(path, bytes);
}

// A scratch context for measuring text where nothing is drawn yet.
template <class F>
auto with_scratch_context(F&& f) {
  free_font_caches_at_exit();
  const SurfacePtr s = image_surface(1, 1);
  const ContextPtr cr(cairo_create(s.get()), &cairo_destroy);
  return f(cr.get());
}

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

// ---- Heatmap geometry: cells at least 512 pixels square; room on the left
// for the position ticks, on the right for the colour bar and its labels.
constexpr int kHeatLeft = 78, kHeatTop = 48, kHeatBottom = 62, kHeatBarGap = 24, kHeatBarWidth = 20,
              kHeatRight = 110;

int heat_cell(std::int64_t n) {
  return static_cast<int>(std::max<std::int64_t>(1, (512 + n - 1) / n));
}

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

PixelBox heatmap_cells(std::int64_t n) {
  const int side = static_cast<int>(n) * heat_cell(n);
  return {kHeatLeft, kHeatTop, side, side};
}

PixelBox heatmap_colour_bar(std::int64_t n) {
  const PixelBox cells = heatmap_cells(n);
  return {cells.x + cells.w + kHeatBarGap, cells.y, kHeatBarWidth, cells.h};
}

void write_heatmap(const std::filesystem::path& path, const Heatmap& h) {
  constexpr std::int64_t kMaxCells = 4096;
  if (h.n < 1 || h.n > kMaxCells) {
    throw Error("heatmap of " + std::to_string(h.n) + " x " + std::to_string(h.n) +
                " cells: draw between 1 and " + std::to_string(kMaxCells) +
                " per side (subsample larger tables)");
  }
  if (h.values.size() != static_cast<std::size_t>(h.n * h.n)) {
    throw Error("heatmap '" + h.title + "' has " + std::to_string(h.values.size()) +
                " values, not " + std::to_string(h.n) + " x " + std::to_string(h.n));
  }
  const PixelBox cells = heatmap_cells(h.n), bar = heatmap_colour_bar(h.n);
  const int cell = heat_cell(h.n), n = static_cast<int>(h.n);
  const int width = bar.x + bar.w + kHeatRight, height = cells.y + cells.h + kHeatBottom;
  render(path, width, height, [&](cairo_t* cr) {
    draw_text(cr, cells.x, 30, h.title, fitted(cr, h.title, kTitleFont, width - cells.x - 8),
              Align::left);
    // The cells as an image at its final size, drawn 1:1 (exact pixels in a
    // PNG, one embedded image instead of n^2 rectangles in an SVG).
    const SurfacePtr image = image_surface(cells.w, cells.h);
    check_cairo(cairo_surface_status(image.get()), path);
    cairo_surface_flush(image.get());
    unsigned char* data = cairo_image_surface_get_data(image.get());
    const int stride = cairo_image_surface_get_stride(image.get());
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) {
        const Rgb c = diverging_colour(h.values[static_cast<std::size_t>(i * n + j)]);
        const std::uint32_t pixel = (std::uint32_t{c.r} << 16) | (std::uint32_t{c.g} << 8) | c.b;
        for (int y = i * cell; y < (i + 1) * cell; ++y) {
          auto* row =
              reinterpret_cast<std::uint32_t*>(data + static_cast<std::ptrdiff_t>(y) * stride);
          std::fill(row + j * cell, row + (j + 1) * cell, pixel);
        }
      }
    }
    cairo_surface_mark_dirty(image.get());
    cairo_set_source_surface(cr, image.get(), cells.x, cells.y);
    cairo_paint(cr);
    frame(cr, cells, kBlack);

    // Position ticks on both axes: cell i is position i * step.
    for (double t : nice_ticks(0, h.last, 8)) {
      const double p = std::round(t / h.step * cell + cell / 2.0);
      const std::string label = format("%.0f", t);
      hairline(cr, cells.x + p, cells.y + cells.h, cells.x + p, cells.y + cells.h + 4, kBlack);
      draw_text(cr, cells.x + p + 0.5, cells.y + cells.h + 18, label, kTickFont, Align::centre);
      hairline(cr, cells.x - 5, cells.y + p, cells.x - 1, cells.y + p, kBlack);
      draw_text(cr, cells.x - 8, cells.y + p + 4.5, label, kTickFont, Align::right);
    }
    draw_text(cr, cells.x + cells.w / 2.0, cells.y + cells.h + 44, h.axis_label, kLabelFont,
              Align::centre);
    draw_text_up(cr, 22, cells.y + cells.h / 2.0, h.axis_label, kLabelFont);

    // Colour bar: the same linear ramps as diverging_colour, +1 at the top.
    std::unique_ptr<cairo_pattern_t, decltype(&cairo_pattern_destroy)> ramp(
        cairo_pattern_create_linear(0, bar.y, 0, bar.y + bar.h), &cairo_pattern_destroy);
    for (double v : {1.0, 0.0, -1.0}) {
      const Rgb c = diverging_colour(v);
      cairo_pattern_add_color_stop_rgb(ramp.get(), (1 - v) / 2, c.r / 255.0, c.g / 255.0,
                                       c.b / 255.0);
    }
    cairo_set_source(cr, ramp.get());
    cairo_rectangle(cr, bar.x, bar.y, bar.w, bar.h);
    cairo_fill(cr);
    frame(cr, bar, kBlack);
    for (double v : {1.0, 0.5, 0.0, -0.5, -1.0}) {
      const double y = std::round(bar.y + (1 - v) / 2 * (bar.h - 1));
      hairline(cr, bar.x + bar.w, y, bar.x + bar.w + 4, y, kBlack);
      draw_text(cr, bar.x + bar.w + 8, y + 4.5, v == 0 ? "0" : format("%+.1f", v), kTickFont,
                Align::left);
    }
    draw_text_up(cr, bar.x + bar.w + 58, bar.y + bar.h / 2.0, h.value_label, kLabelFont);
  });
}

}  // namespace posembed::tools
