#include "posembed/tools/plot/canvas.h"

#include <cairo-svg.h>
#include <fontconfig/fontconfig.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>

#include "posembed/core/error.h"

namespace posembed::tools::canvas {
namespace {

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

cairo_status_t append_bytes(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
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

}  // namespace

std::uint8_t lerp(std::uint8_t a, std::uint8_t b, double t) {
  return static_cast<std::uint8_t>(std::lround(a + (b - a) * t));
}

void set_colour(cairo_t* cr, Rgb c) {
  cairo_set_source_rgb(cr, c.r / 255.0, c.g / 255.0, c.b / 255.0);
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

SurfacePtr image_surface(int width, int height) {
  return {cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height), &cairo_surface_destroy};
}

void check_cairo(cairo_status_t status, const std::filesystem::path& path) {
  if (status != CAIRO_STATUS_SUCCESS) {
    throw Error("cairo failed drawing " + path.string() + ": " + cairo_status_to_string(status));
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

}  // namespace posembed::tools::canvas
