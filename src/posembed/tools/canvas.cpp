#include "posembed/tools/canvas.h"

#include <png.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "posembed/core/error.h"
#include "posembed/tools/format.h"

namespace posembed::tools {
namespace {

// 5x7 glyphs, seven rows of five pixels each, '#' = ink.
struct Glyph {
  char c;
  const char* rows[7];
};

constexpr Glyph kFont[] = {
    {' ', {".....", ".....", ".....", ".....", ".....", ".....", "....."}},
    {'0', {".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."}},
    {'1', {"..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."}},
    {'2', {".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"}},
    {'3', {"#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."}},
    {'4', {"...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."}},
    {'5', {"#####", "#....", "####.", "....#", "....#", "#...#", ".###."}},
    {'6', {"..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."}},
    {'7', {"#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."}},
    {'8', {".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."}},
    {'9', {".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."}},
    {'A', {".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"}},
    {'B', {"####.", "#...#", "#...#", "####.", "#...#", "#...#", "####."}},
    {'C', {".###.", "#...#", "#....", "#....", "#....", "#...#", ".###."}},
    {'D', {"###..", "#..#.", "#...#", "#...#", "#...#", "#..#.", "###.."}},
    {'E', {"#####", "#....", "#....", "####.", "#....", "#....", "#####"}},
    {'F', {"#####", "#....", "#....", "####.", "#....", "#....", "#...."}},
    {'G', {".###.", "#...#", "#....", "#.###", "#...#", "#...#", ".####"}},
    {'H', {"#...#", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"}},
    {'I', {".###.", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."}},
    {'J', {"..###", "...#.", "...#.", "...#.", "...#.", "#..#.", ".##.."}},
    {'K', {"#...#", "#..#.", "#.#..", "##...", "#.#..", "#..#.", "#...#"}},
    {'L', {"#....", "#....", "#....", "#....", "#....", "#....", "#####"}},
    {'M', {"#...#", "##.##", "#.#.#", "#.#.#", "#...#", "#...#", "#...#"}},
    {'N', {"#...#", "#...#", "##..#", "#.#.#", "#..##", "#...#", "#...#"}},
    {'O', {".###.", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."}},
    {'P', {"####.", "#...#", "#...#", "####.", "#....", "#....", "#...."}},
    {'Q', {".###.", "#...#", "#...#", "#...#", "#.#.#", "#..#.", ".##.#"}},
    {'R', {"####.", "#...#", "#...#", "####.", "#.#..", "#..#.", "#...#"}},
    {'S', {".####", "#....", "#....", ".###.", "....#", "....#", "####."}},
    {'T', {"#####", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.."}},
    {'U', {"#...#", "#...#", "#...#", "#...#", "#...#", "#...#", ".###."}},
    {'V', {"#...#", "#...#", "#...#", "#...#", "#...#", ".#.#.", "..#.."}},
    {'W', {"#...#", "#...#", "#...#", "#.#.#", "#.#.#", "#.#.#", ".#.#."}},
    {'X', {"#...#", "#...#", ".#.#.", "..#..", ".#.#.", "#...#", "#...#"}},
    {'Y', {"#...#", "#...#", ".#.#.", "..#..", "..#..", "..#..", "..#.."}},
    {'Z', {"#####", "....#", "...#.", "..#..", ".#...", "#....", "#####"}},
    {'.', {".....", ".....", ".....", ".....", ".....", ".##..", ".##.."}},
    {',', {".....", ".....", ".....", ".....", ".##..", "..#..", ".#..."}},
    {'-', {".....", ".....", ".....", "#####", ".....", ".....", "....."}},
    {'+', {".....", "..#..", "..#..", "#####", "..#..", "..#..", "....."}},
    {'%', {"##...", "##..#", "...#.", "..#..", ".#...", "#..##", "...##"}},
    {'(', {"...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#."}},
    {')', {".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..."}},
    {'/', {".....", "....#", "...#.", "..#..", ".#...", "#....", "....."}},
    {';', {".....", ".##..", ".##..", ".....", ".##..", "..#..", ".#..."}},
    {':', {".....", ".##..", ".##..", ".....", ".##..", ".##..", "....."}},
    {'=', {".....", ".....", "#####", ".....", "#####", ".....", "....."}},
    {'^', {"..#..", ".#.#.", "#...#", ".....", ".....", ".....", "....."}},
    {'_', {".....", ".....", ".....", ".....", ".....", ".....", "#####"}},
    {'<', {"...#.", "..#..", ".#...", "#....", ".#...", "..#..", "...#."}},
    {'>', {".#...", "..#..", "...#.", "....#", "...#.", "..#..", ".#..."}},
    {'\'', {"..#..", "..#..", ".#...", ".....", ".....", ".....", "....."}},
    {'?', {".###.", "#...#", "....#", "...#.", "..#..", ".....", "..#.."}},
};

const Glyph& glyph(char c) {
  if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  for (const Glyph& g : kFont) {
    if (g.c == c) return g;
  }
  return kFont[sizeof kFont / sizeof kFont[0] - 1];  // '?'
}

std::uint8_t lerp(std::uint8_t a, std::uint8_t b, double t) {
  return static_cast<std::uint8_t>(std::lround(a + (b - a) * t));
}

}  // namespace

Rgb diverging_colour(double v) {
  // Endpoints close to ColorBrewer's RdBu: dark blue (33, 102, 172), dark red (178, 24, 43).
  if (!(v == v)) return kGrey;  // NaN
  v = std::clamp(v, -1.0, 1.0);
  const Rgb blue{33, 102, 172}, red{178, 24, 43};
  const Rgb& end = v < 0 ? blue : red;
  const double t = std::abs(v);
  return {lerp(255, end.r, t), lerp(255, end.g, t), lerp(255, end.b, t)};
}

Canvas::Canvas(int width, int height, Rgb background)
    : width_(width), height_(height),
      pixels_(static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3) {
  fill_rect(0, 0, width, height, background);
}

void Canvas::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  const std::size_t i = (static_cast<std::size_t>(y) * static_cast<std::size_t>(width_) +
                         static_cast<std::size_t>(x)) * 3;
  pixels_[i] = c.r;
  pixels_[i + 1] = c.g;
  pixels_[i + 2] = c.b;
}

void Canvas::fill_rect(int x0, int y0, int x1, int y1, Rgb c) {
  for (int y = std::max(y0, 0); y < std::min(y1, height_); ++y) {
    for (int x = std::max(x0, 0); x < std::min(x1, width_); ++x) set(x, y, c);
  }
}

void Canvas::line(int x0, int y0, int x1, int y1, Rgb c) {
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
  const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  while (true) {
    set(x0, y0, c);
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y0 += sy;
    }
  }
}

void Canvas::dashed_hline(int x0, int x1, int y, Rgb c) {
  for (int x = x0; x <= x1; ++x) {
    if ((x - x0) % 8 < 5) set(x, y, c);
  }
}

int Canvas::text(int x, int y, std::string_view s, Rgb c, int scale) {
  for (std::size_t k = 0; k < s.size(); ++k) {
    const Glyph& g = glyph(s[k]);
    const int gx = x + static_cast<int>(k) * 6 * scale;
    for (int row = 0; row < 7; ++row) {
      for (int col = 0; col < 5; ++col) {
        if (g.rows[row][col] == '#') {
          fill_rect(gx + col * scale, y + row * scale, gx + (col + 1) * scale,
                    y + (row + 1) * scale, c);
        }
      }
    }
  }
  return text_width(s, scale);
}

int Canvas::text_vertical(int x, int y, std::string_view s, Rgb c, int scale) {
  // Rotated 90 degrees counter-clockwise: the text reads upwards from (x, y).
  for (std::size_t k = 0; k < s.size(); ++k) {
    const Glyph& g = glyph(s[k]);
    const int gy = y - static_cast<int>(k) * 6 * scale;
    for (int row = 0; row < 7; ++row) {
      for (int col = 0; col < 5; ++col) {
        if (g.rows[row][col] == '#') {
          fill_rect(x + row * scale, gy - (col + 1) * scale, x + (row + 1) * scale,
                    gy - col * scale, c);
        }
      }
    }
  }
  return text_width(s, scale);
}

void Canvas::write_png(const std::filesystem::path& path) const {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "wb"), &std::fclose);
  if (!file) throw Error("cannot write " + path.string() + ": check the directory exists");
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info) {
    png_destroy_write_struct(&png, nullptr);
    throw Error("libpng: out of memory writing " + path.string());
  }
  // libpng reports errors by longjmp; nothing with a destructor lives between
  // here and the end of the writes.
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw Error("libpng failed writing " + path.string() + " (disk full?)");
  }
  png_init_io(png, file.get());
  png_set_compression_level(png, 9);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width_), static_cast<png_uint_32>(height_), 8,
               PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < height_; ++y) {
    png_write_row(png, pixels_.data() + static_cast<std::size_t>(y) *
                                            static_cast<std::size_t>(width_) * 3);
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
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
  static constexpr Rgb kColours[] = {{33, 102, 172}, {178, 24, 43},  {27, 120, 55},
                                     {230, 120, 0},  {118, 42, 131}, {0, 150, 150},
                                     {110, 110, 110}, {200, 60, 160}};
  constexpr int n = sizeof kColours / sizeof kColours[0];
  return kColours[((i % n) + n) % n];
}

namespace {

std::string tick_label(double v) {
  const double a = std::abs(v);
  if (a == 0) return "0";
  if (a >= 1e5 || a < 1e-3) return format("%.0E", v);
  return format("%g", v);
}

// Ticks on a log axis: 1, 2, 5 x 10^k inside [lo, hi]; only powers of ten over
// many decades; the ends when nothing else falls inside.
std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> ticks;
  const bool sparse = std::log10(hi / lo) > 4;
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
  int p0 = 0, p1 = 1;     // pixels of lo and hi
  double f(double v) const { return log ? std::log10(v) : v; }
  int pixel(double v) const {
    const double t = (f(v) - f(lo)) / (f(hi) - f(lo));
    return p0 + static_cast<int>(std::lround(t * (p1 - p0)));
  }
};

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

}  // namespace

void write_line_plot_png(const std::filesystem::path& path, const LinePlot& plot) {
  if (plot.width < 200 || plot.height < 150) {
    throw Error("plot '" + plot.title + "' must be at least 200 x 150 pixels");
  }
  // Ranges from the finite data (log axes: positive data only, else an error).
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
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
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

  const int left = 84, right = 24, top = 52, bottom = 58;
  Canvas c(plot.width, plot.height);
  const int x0 = left, x1 = plot.width - right, y0 = top, y1 = plot.height - bottom;
  const Axis ax{plot.log_x, x_lo, x_hi, x0, x1}, ay{plot.log_y, y_lo, y_hi, y1, y0};
  const auto clamp_y = [&](int py) { return std::clamp(py, y0, y1); };

  const int title_scale = Canvas::text_width(plot.title, 2) <= plot.width - left - 8 ? 2 : 1;
  c.text(left, title_scale == 2 ? 14 : 20, plot.title, kBlack, title_scale);

  // Grid and tick labels.
  std::vector<double> xt = plot.x_ticks;
  if (xt.empty()) xt = plot.log_x ? log_ticks(x_lo, x_hi) : nice_ticks(x_lo, x_hi, 8);
  for (double t : xt) {
    if (t < x_lo - 1e-9 * std::abs(x_hi - x_lo) || t > x_hi + 1e-9 * std::abs(x_hi - x_lo)) continue;
    const int px = ax.pixel(t);
    for (int y = y0 + 1; y < y1; y += 2) c.set(px, y, kLightGrey);
    c.line(px, y1, px, y1 + 4, kBlack);
    const std::string label = tick_label(t);
    c.text(px - Canvas::text_width(label) / 2, y1 + 9, label, kBlack);
  }
  const std::vector<double> yt = plot.log_y ? log_ticks(y_lo, y_hi) : nice_ticks(y_lo, y_hi, 6);
  for (double t : yt) {
    const int py = ay.pixel(t);
    if (py < y0 || py > y1) continue;
    c.dashed_hline(x0 + 1, x1 - 1, py, kLightGrey);
    c.line(x0 - 4, py, x0, py, kBlack);
    const std::string label = tick_label(t);
    c.text(x0 - 8 - Canvas::text_width(label), py - 3, label, kBlack);
  }
  c.text((x0 + x1) / 2 - Canvas::text_width(plot.x_label) / 2, y1 + 26, plot.x_label, kBlack);
  c.text_vertical(14, (y0 + y1) / 2 + Canvas::text_width(plot.y_label) / 2, plot.y_label, kBlack);

  // Bands first (light), then lines and markers on top.
  const auto light = [](Rgb k) { return Rgb{lerp(k.r, 255, 0.78), lerp(k.g, 255, 0.78), lerp(k.b, 255, 0.78)}; };
  for (const PlotSeries& s : plot.series) {
    if (s.y_lo.empty()) continue;
    const Rgb band = light(s.colour);
    for (std::size_t i = 1; i < s.x.size(); ++i) {
      const double a[4] = {s.x[i - 1], s.x[i], s.y_lo[i - 1], s.y_lo[i]};
      const double b[2] = {s.y_hi[i - 1], s.y_hi[i]};
      if (!std::isfinite(a[0] + a[1] + a[2] + a[3] + b[0] + b[1])) continue;
      const int pa = ax.pixel(a[0]), pb = ax.pixel(a[1]);
      for (int px = std::min(pa, pb); px <= std::max(pa, pb); ++px) {
        const double t = pa == pb ? 0.0 : static_cast<double>(px - pa) / (pb - pa);
        const int lo = clamp_y(static_cast<int>(std::lround(ay.pixel(a[2]) + t * (ay.pixel(a[3]) - ay.pixel(a[2])))));
        const int hi = clamp_y(static_cast<int>(std::lround(ay.pixel(b[0]) + t * (ay.pixel(b[1]) - ay.pixel(b[0])))));
        for (int y = std::min(lo, hi); y <= std::max(lo, hi); ++y) c.set(px, y, band);
      }
    }
  }
  for (const PlotSeries& s : plot.series) {
    int dash = 0;  // pixels drawn so far along a dashed series: 7 on, 5 off
    const auto segment = [&](int xa, int ya, int xb, int yb) {
      const int n = std::max(std::abs(xb - xa), std::abs(yb - ya));
      for (int k = 0; k <= n; ++k, ++dash) {
        if (s.dashed && dash % 12 >= 7) continue;
        const double t = n == 0 ? 0.0 : static_cast<double>(k) / n;
        const int px = xa + static_cast<int>(std::lround(t * (xb - xa)));
        const int py = ya + static_cast<int>(std::lround(t * (yb - ya)));
        c.set(px, py, s.colour);
        c.set(px, py + 1, s.colour);  // two pixels thick
      }
    };
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      const int px = ax.pixel(s.x[i]), py = clamp_y(ay.pixel(s.y[i]));
      if (i > 0 && std::isfinite(s.x[i - 1]) && std::isfinite(s.y[i - 1])) {
        segment(ax.pixel(s.x[i - 1]), clamp_y(ay.pixel(s.y[i - 1])), px, py);
      }
      if (s.markers) c.fill_rect(px - 2, py - 2, px + 3, py + 3, s.colour);
    }
  }
  c.line(x0, y0, x1, y0, kBlack);
  c.line(x0, y1, x1, y1, kBlack);
  c.line(x0, y0, x0, y1, kBlack);
  c.line(x1, y0, x1, y1, kBlack);

  // Legend in the corner that covers the fewest data points.
  int label_w = 0, entries = 0;
  for (const PlotSeries& s : plot.series) {
    if (s.label.empty()) continue;
    label_w = std::max(label_w, Canvas::text_width(s.label));
    ++entries;
  }
  if (entries == 0) {
    c.write_png(path);
    return;
  }
  const int box_w = label_w + 44, box_h = entries * 14 + 10;
  const int corners[4][2] = {{x1 - 8 - box_w, y0 + 8}, {x0 + 8, y0 + 8},
                             {x1 - 8 - box_w, y1 - 8 - box_h}, {x0 + 8, y1 - 8 - box_h}};
  int best = 0;
  long best_count = -1;
  for (int k = 0; k < 4; ++k) {
    long count = 0;
    for (const PlotSeries& s : plot.series) {
      for (std::size_t i = 0; i < s.x.size(); ++i) {
        if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
        const int px = ax.pixel(s.x[i]), py = ay.pixel(s.y[i]);
        count += px >= corners[k][0] && px <= corners[k][0] + box_w && py >= corners[k][1] &&
                 py <= corners[k][1] + box_h;
      }
    }
    if (best_count < 0 || count < best_count) {
      best = k;
      best_count = count;
    }
  }
  const int bx = corners[best][0], by = corners[best][1];
  c.fill_rect(bx, by, bx + box_w, by + box_h, kWhite);
  c.line(bx, by, bx + box_w, by, kGrey);
  c.line(bx, by + box_h, bx + box_w, by + box_h, kGrey);
  c.line(bx, by, bx, by + box_h, kGrey);
  c.line(bx + box_w, by, bx + box_w, by + box_h, kGrey);
  int row = 0;
  for (const PlotSeries& s : plot.series) {
    if (s.label.empty()) continue;
    const int ly = by + 8 + row * 14;
    for (int x = bx + 6; x < bx + 30; ++x) {
      if (s.dashed && (x - bx - 6) % 12 >= 7) continue;
      c.set(x, ly + 3, s.colour);
      c.set(x, ly + 4, s.colour);
    }
    c.text(bx + 36, ly, s.label, kBlack);
    ++row;
  }
  c.write_png(path);
}

}  // namespace posembed::tools
