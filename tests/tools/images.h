// Reading the tools' plots back for the tests: PNG through libpng, SVG through
// expat (a well-formedness check and element counts).
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "posembed/tools/plot.h"

namespace posembed::tools::readback {

struct PngImage {
  int width = 0, height = 0;
  bool rgb8 = false;              // stored as 8-bit RGB without alpha
  std::vector<std::uint8_t> rgb;  // (height, width, 3)
  Rgb at(int x, int y) const {
    const std::size_t i = (static_cast<std::size_t>(y) * static_cast<std::size_t>(width) +
                           static_cast<std::size_t>(x)) *
                          3;
    return {rgb[i], rgb[i + 1], rgb[i + 2]};
  }
};
// Throws std::runtime_error with libpng's message when the file does not decode.
PngImage read_png(const std::filesystem::path& path);

struct SvgSummary {
  std::string root;  // the root element as "namespace-uri|name"
  std::map<std::string, std::string> root_attributes;
  std::map<std::string, int> elements;  // element name -> count, the root included
  int count(const std::string& name) const {
    const auto it = elements.find(name);
    return it == elements.end() ? 0 : it->second;
  }
};
// Throws std::runtime_error with expat's message and line when the file is not
// well-formed XML.
SvgSummary read_svg(const std::filesystem::path& path);

inline bool same(Rgb a, Rgb b) {
  return a.r == b.r && a.g == b.g && a.b == b.b;
}
inline int distance(Rgb a, Rgb b) {  // the largest channel difference
  const auto d = [](int u, int v) { return u > v ? u - v : v - u; };
  return std::max({d(a.r, b.r), d(a.g, b.g), d(a.b, b.b)});
}

}  // namespace posembed::tools::readback
