#include <algorithm>
#include <cmath>

#include "posembed/core/error.h"
#include "posembed/tools/format.h"
#include "posembed/tools/plot.h"
#include "posembed/tools/plot/canvas.h"

namespace posembed::tools {
namespace {

using namespace canvas;

// ---- Heatmap geometry: cells at least 512 pixels square; room on the left
// for the position ticks, on the right for the colour bar and its labels.
constexpr int kHeatLeft = 78, kHeatTop = 48, kHeatBottom = 62, kHeatBarGap = 24, kHeatBarWidth = 20,
              kHeatRight = 110;

int heat_cell(std::int64_t n) {
  return static_cast<int>(std::max<std::int64_t>(1, (512 + n - 1) / n));
}

}  // namespace

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
