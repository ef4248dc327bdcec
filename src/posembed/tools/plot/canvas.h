// What the plots draw with (internal to the tools layer): colours, one-line
// text with sub- and superscripts, hairlines, and a surface rendered to a PNG or
// SVG file that is written whole or not at all.
#pragma once

#include <cairo.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string_view>

#include "posembed/tools/plot.h"

namespace posembed::tools::canvas {

std::uint8_t lerp(std::uint8_t a, std::uint8_t b, double t);
void set_colour(cairo_t* cr, Rgb c);

// ---- Text: DejaVu Sans through cairo's toy font API (fontconfig finds the
// file), with sub- and superscript runs. The toy API is enough for one-line
// labels in one script and keeps pango, glib and harfbuzz out of the build.

struct Font {
  double size = 11;
  bool bold = false;
};
constexpr Font kTitleFont{15, true}, kFigureTitleFont{17, true}, kLabelFont{12.5, false},
    kTickFont{11, false};

double text_width(cairo_t* cr, std::string_view s, Font f);
// The font shrunk (down to 8 px) so that s fits in max_width.
Font fitted(cairo_t* cr, std::string_view s, Font f, double max_width);

enum class Align { left, centre, right };

// s with its baseline at y, starting at, centred on or ending at x.
void draw_text(cairo_t* cr, double x, double y, std::string_view s, Font f, Align align);
// Reading upwards, centred on (x, y) along the text, baseline at x.
void draw_text_up(cairo_t* cr, double x, double y, std::string_view s, Font f);
// A 1-pixel line between pixel centres, crisp on integer coordinates.
void hairline(cairo_t* cr, double x0, double y0, double x1, double y1, Rgb c);
// A 1-pixel frame just outside the box.
void frame(cairo_t* cr, const PixelBox& b, Rgb c);

// ---- Surfaces and files

using SurfacePtr = std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)>;
using ContextPtr = std::unique_ptr<cairo_t, decltype(&cairo_destroy)>;

void free_font_caches_at_exit();
SurfacePtr image_surface(int width, int height);
// Throws posembed::Error naming the file being drawn.
void check_cairo(cairo_status_t status, const std::filesystem::path& path);
// Draws on a white width x height surface of the path's format and writes the
// file. Errors from `draw` (bad plot data) leave no file behind.
void render(const std::filesystem::path& path, int width, int height,
            const std::function<void(cairo_t*)>& draw);

// A scratch context for measuring text where nothing is drawn yet.
template <class F>
auto with_scratch_context(F&& f) {
  free_font_caches_at_exit();
  const SurfacePtr s = image_surface(1, 1);
  const ContextPtr cr(cairo_create(s.get()), &cairo_destroy);
  return f(cr.get());
}

}  // namespace posembed::tools::canvas
