#include "tools/images.h"

#include <expat.h>
#include <png.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>

namespace posembed::tools::readback {

PngImage read_png(const std::filesystem::path& path) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&image, path.c_str())) {
    throw std::runtime_error(path.string() + ": " + image.message);
  }
  PngImage out;
  out.width = static_cast<int>(image.width);
  out.height = static_cast<int>(image.height);
  out.rgb8 = image.format == PNG_FORMAT_RGB;  // the file's own format, before conversion
  image.format = PNG_FORMAT_RGB;
  out.rgb.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, out.rgb.data(), 0, nullptr)) {
    throw std::runtime_error(path.string() + ": " + image.message);
  }
  return out;
}

namespace {

std::string local_name(const XML_Char* name) {
  // Names come as "namespace-uri|local" with namespace processing on.
  const std::string s(name);
  const std::size_t bar = s.rfind('|');
  return bar == std::string::npos ? s : s.substr(bar + 1);
}

void XMLCALL on_start(void* data, const XML_Char* name, const XML_Char** attributes) {
  auto* svg = static_cast<SvgSummary*>(data);
  if (svg->root.empty()) {
    svg->root = name;
    for (int i = 0; attributes[i] != nullptr; i += 2) {
      svg->root_attributes[local_name(attributes[i])] = attributes[i + 1];
    }
  }
  ++svg->elements[local_name(name)];
}

}  // namespace

SvgSummary read_svg(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::unique_ptr<XML_ParserStruct, decltype(&XML_ParserFree)> parser(
      XML_ParserCreateNS(nullptr, '|'), &XML_ParserFree);
  SvgSummary svg;
  XML_SetUserData(parser.get(), &svg);
  XML_SetStartElementHandler(parser.get(), on_start);
  if (XML_Parse(parser.get(), text.data(), static_cast<int>(text.size()), 1) != XML_STATUS_OK) {
    throw std::runtime_error(path.string() + " is not well-formed XML: " +
                             XML_ErrorString(XML_GetErrorCode(parser.get())) + " at line " +
                             std::to_string(XML_GetCurrentLineNumber(parser.get())));
  }
  return svg;
}

}  // namespace posembed::tools::readback
