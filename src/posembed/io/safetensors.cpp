#include "posembed/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "posembed/core/error.h"
#include "posembed/core/half.h"

namespace posembed::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; posembed reads it in place");

namespace {

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  std::size_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {DType::BOOL, "BOOL", 1}, {DType::U8, "U8", 1},     {DType::I8, "I8", 1},
    {DType::U16, "U16", 2},   {DType::I16, "I16", 2},   {DType::U32, "U32", 4},
    {DType::I32, "I32", 4},   {DType::U64, "U64", 8},   {DType::I64, "I64", 8},
    {DType::F16, "F16", 2},   {DType::BF16, "BF16", 2}, {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},   {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
};

const DTypeEntry& entry(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e;
  }
  throw Error("unknown dtype enumerator " + std::to_string(static_cast<int>(dtype)));
}

std::string errno_text() { return std::strerror(errno); }

template <class T>
T load(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof value);  // the data need not be aligned
  return value;
}

// 8-bit floats. E4M3 ("fn"): bias 7, no infinities, S.1111.111 is NaN, max 448.
// E5M2: bias 15, IEEE-like with infinities, max 57344.
struct MiniFloat {
  int mant_bits, bias;
  bool has_inf;
};
constexpr MiniFloat kE4M3{3, 7, false};
constexpr MiniFloat kE5M2{2, 15, true};

double minifloat_to_double(std::uint8_t v, MiniFloat f) {
  const bool negative = v & 0x80u;
  const int exp_bits = 7 - f.mant_bits;
  const int exp = (v >> f.mant_bits) & ((1 << exp_bits) - 1);
  const int mant = v & ((1 << f.mant_bits) - 1);
  const int max_exp = (1 << exp_bits) - 1;
  double value;
  if (f.has_inf && exp == max_exp) {
    value = mant == 0 ? std::numeric_limits<double>::infinity()
                      : std::numeric_limits<double>::quiet_NaN();
  } else if (!f.has_inf && exp == max_exp && mant == (1 << f.mant_bits) - 1) {
    value = std::numeric_limits<double>::quiet_NaN();
  } else if (exp == 0) {
    value = std::ldexp(mant, 1 - f.bias - f.mant_bits);
  } else {
    value = std::ldexp((1 << f.mant_bits) + mant, exp - f.bias - f.mant_bits);
  }
  return negative ? -value : value;
}

std::uint8_t minifloat_from_float(float x, MiniFloat f) {
  const std::uint8_t sign = std::signbit(x) ? 0x80u : 0x00u;
  const int exp_bits = 7 - f.mant_bits;
  const int max_exp = (1 << exp_bits) - 1;
  const auto nan = static_cast<std::uint8_t>(sign | 0x7Fu);  // all ones: NaN in both formats
  const auto inf = static_cast<std::uint8_t>(f.has_inf ? (sign | (max_exp << f.mant_bits)) : nan);
  if (std::isnan(x)) return nan;
  const double a = std::abs(static_cast<double>(x));
  if (std::isinf(a)) return inf;
  const int min_normal_exp = 1 - f.bias;
  int e = 0;
  std::frexp(a, &e);
  --e;  // a in [2^e, 2^(e+1))
  const double quantum = std::ldexp(1.0, std::max(e, min_normal_exp) - f.mant_bits);
  const double q = std::nearbyint(a / quantum);  // exact division by a power of two; ties to even
  const double rounded = q * quantum;
  if (rounded < std::ldexp(1.0, min_normal_exp)) return static_cast<std::uint8_t>(sign | static_cast<int>(q));
  std::frexp(rounded, &e);
  --e;
  const int exp_field = e + f.bias;
  const int mant = static_cast<int>(std::ldexp(rounded, f.mant_bits - e)) - (1 << f.mant_bits);
  const int top = f.has_inf ? max_exp - 1 : max_exp;
  if (exp_field > top || (!f.has_inf && exp_field == max_exp && mant == (1 << f.mant_bits) - 1)) {
    return inf;  // out of range: infinity in E5M2, NaN in E4M3 (it has no infinity)
  }
  return static_cast<std::uint8_t>(sign | (exp_field << f.mant_bits) | mant);
}

// The number of `dtype` elements in `data`; throws when it is not whole.
std::size_t element_count(DType dtype, std::span<const std::byte> data) {
  const std::size_t size = dtype_size(dtype);
  if (data.size() % size != 0) {
    throw Error(std::to_string(data.size()) + " bytes are not a whole number of " +
                std::string(dtype_name(dtype)) + " elements");
  }
  return data.size() / size;
}

// element_count, which must be `values`, the size of what they are decoded into.
std::size_t element_count(DType dtype, std::span<const std::byte> data, std::size_t values) {
  const std::size_t n = element_count(dtype, data);
  if (values != n) {
    throw Error(std::to_string(n) + " " + std::string(dtype_name(dtype)) + " elements go into " +
                std::to_string(values) + " values; give as many values as elements");
  }
  return n;
}

// Decodes data's elements into out, as many as there are elements.
template <class Out>
void convert_into(DType dtype, std::span<const std::byte> data, std::span<Out> out) {
  const std::size_t size = dtype_size(dtype), n = element_count(dtype, data, out.size());
  const std::byte* p = data.data();
  if constexpr (std::is_same_v<Out, float>) {
    if (dtype == DType::F32) {  // the same bits: a copy (a GPT-2 token table is 154 MB)
      if (n != 0) std::memcpy(out.data(), p, n * sizeof(float));
      return;
    }
  }
  auto fill = [&](auto decode) {
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<Out>(decode(p + i * size));
  };
  switch (dtype) {
    case DType::BOOL: fill([](const std::byte* q) { return load<std::uint8_t>(q) != 0 ? 1 : 0; }); break;
    case DType::U8: fill([](const std::byte* q) { return load<std::uint8_t>(q); }); break;
    case DType::I8: fill([](const std::byte* q) { return load<std::int8_t>(q); }); break;
    case DType::U16: fill([](const std::byte* q) { return load<std::uint16_t>(q); }); break;
    case DType::I16: fill([](const std::byte* q) { return load<std::int16_t>(q); }); break;
    case DType::U32: fill([](const std::byte* q) { return load<std::uint32_t>(q); }); break;
    case DType::I32: fill([](const std::byte* q) { return load<std::int32_t>(q); }); break;
    case DType::U64: fill([](const std::byte* q) { return load<std::uint64_t>(q); }); break;
    case DType::I64: fill([](const std::byte* q) { return load<std::int64_t>(q); }); break;
    case DType::F16:
      fill([](const std::byte* q) { return to_float(fp16{load<std::uint16_t>(q)}); });
      break;
    case DType::BF16:
      fill([](const std::byte* q) { return to_float(bf16{load<std::uint16_t>(q)}); });
      break;
    case DType::F32: fill([](const std::byte* q) { return load<float>(q); }); break;
    case DType::F64: fill([](const std::byte* q) { return load<double>(q); }); break;
    case DType::F8_E4M3:
      fill([](const std::byte* q) { return minifloat_to_double(load<std::uint8_t>(q), kE4M3); });
      break;
    case DType::F8_E5M2:
      fill([](const std::byte* q) { return minifloat_to_double(load<std::uint8_t>(q), kE5M2); });
      break;
  }
}

template <class Out>
std::vector<Out> convert(DType dtype, std::span<const std::byte> data) {
  std::vector<Out> out(element_count(dtype, data));
  convert_into<Out>(dtype, data, out);
  return out;
}

template <class Int>
Int saturate(float x) {
  if (std::isnan(x)) return 0;
  const double r = std::nearbyint(static_cast<double>(x));
  // Compare in long double-free form: the bounds of 64-bit types are not exact in
  // double, so test against 2^63 / 2^64 directly.
  constexpr double lo = static_cast<double>(std::numeric_limits<Int>::min());
  constexpr double hi_exclusive = static_cast<double>(std::numeric_limits<Int>::max()) + 1.0;
  if (r < lo) return std::numeric_limits<Int>::min();
  if (r >= hi_exclusive) return std::numeric_limits<Int>::max();
  return static_cast<Int>(r);
}

template <class T>
void store(std::vector<std::byte>& out, std::size_t i, T value) {
  std::memcpy(out.data() + i * sizeof(T), &value, sizeof(T));
}

// ---- reading ----

// Containers are summarized, never dumped: dump() recurses once per nesting level.
std::string describe(const nlohmann::json& value) {
  if (value.is_array()) return "array of " + std::to_string(value.size());
  if (value.is_object()) return "object of " + std::to_string(value.size());
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

// A shape whose entries were checked to be non-negative integers, as text:
// "[32, 8]"; past 8 dims, the first 8 and the count.
std::string dims_text(const nlohmann::json& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size() && i < 8; ++i) {
    s += (i ? ", " : "") + std::to_string(shape[i].get<std::uint64_t>());
  }
  if (shape.size() > 8) s += ", ... (" + std::to_string(shape.size()) + " dims)";
  return s + "]";
}

std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, bool& overflow) {
  if (a != 0 && b > std::numeric_limits<std::uint64_t>::max() / a) overflow = true;
  return a * b;
}

}  // namespace

std::string_view dtype_name(DType dtype) { return entry(dtype).name; }
std::size_t dtype_size(DType dtype) { return entry(dtype).size; }
std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& e : kDTypes) {
    if (e.name == name) return e.dtype;
  }
  return std::nullopt;
}
bool is_float(DType dtype) {
  switch (dtype) {
    case DType::F16: case DType::BF16: case DType::F32: case DType::F64:
    case DType::F8_E4M3: case DType::F8_E5M2: return true;
    default: return false;
  }
}

std::string shape_text(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::int64_t TensorInfo::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;  // the reader checked the product fits
  return n;
}

// Each element converts once from its exact value (the decoders return the
// stored type, or a double that holds it exactly), so it rounds once.
void convert_to_f32(DType dtype, std::span<const std::byte> data, std::span<float> out) {
  convert_into<float>(dtype, data, out);
}

std::vector<float> convert_to_f32(DType dtype, std::span<const std::byte> data) {
  return convert<float>(dtype, data);
}

std::vector<double> convert_to_f64(DType dtype, std::span<const std::byte> data) {
  return convert<double>(dtype, data);
}

std::vector<std::byte> convert_from_f32(DType dtype, std::span<const float> values) {
  const std::size_t n = values.size();
  std::vector<std::byte> out(n * dtype_size(dtype));
  if (n == 0) return out;
  if (dtype == DType::F32) {
    std::memcpy(out.data(), values.data(), n * sizeof(float));
    return out;
  }
  auto put = [&](auto encode) {
    using T = decltype(encode(0.0f));
    for (std::size_t i = 0; i < n; ++i) store<T>(out, i, encode(values[i]));
  };
  // One dtype a line:
  // clang-format off
  switch (dtype) {
    case DType::BOOL: put([](float x) { return static_cast<std::uint8_t>(x != 0.0f); }); break;
    case DType::U8: put(saturate<std::uint8_t>); break;
    case DType::I8: put(saturate<std::int8_t>); break;
    case DType::U16: put(saturate<std::uint16_t>); break;
    case DType::I16: put(saturate<std::int16_t>); break;
    case DType::U32: put(saturate<std::uint32_t>); break;
    case DType::I32: put(saturate<std::int32_t>); break;
    case DType::U64: put(saturate<std::uint64_t>); break;
    case DType::I64: put(saturate<std::int64_t>); break;
    case DType::F16: put([](float x) { return to_fp16(x).bits; }); break;
    case DType::BF16: put([](float x) { return to_bf16(x).bits; }); break;
    case DType::F64: put([](float x) { return static_cast<double>(x); }); break;
    case DType::F8_E4M3: put([](float x) { return minifloat_from_float(x, kE4M3); }); break;
    case DType::F8_E5M2: put([](float x) { return minifloat_from_float(x, kE5M2); }); break;
    case DType::F32: break;  // above
  }
  // clang-format on
  return out;
}

struct SafetensorsFile::Storage {
  void* mapping = nullptr;
  std::size_t mapping_bytes = 0;
  std::vector<std::byte> owned;
  std::span<const std::byte> bytes;
  ~Storage() {
    if (mapping != nullptr) munmap(mapping, mapping_bytes);
  }
};

SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

std::uint64_t SafetensorsFile::file_bytes() const { return storage_ ? storage_->bytes.size() : 0; }

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile file;
  file.source_ = path.string();
  file.storage_ = std::make_unique<Storage>();
  // Non-blocking: opening a FIFO for reading would otherwise wait for a writer
  // forever, before the check below could refuse it (a regular file ignores it).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error("cannot open " + path.string() + ": " + errno_text());
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path.string() + " is not a regular file (a FIFO, a device or a folder); " +
                "give a safetensors file");
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size >= 8) {  // smaller files fail in parse() with a clear message; mmap(0) is invalid
    void* mapping = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) {
      const std::string why = errno_text();
      ::close(fd);
      throw Error("cannot memory-map " + path.string() + ": " + why);
    }
    file.storage_->mapping = mapping;
    file.storage_->mapping_bytes = size;
    file.storage_->bytes = {static_cast<const std::byte*>(mapping), size};
  } else {
    file.storage_->owned.resize(size);
    if (size > 0 && ::read(fd, file.storage_->owned.data(), size) != static_cast<ssize_t>(size)) {
      ::close(fd);
      throw Error("cannot read " + path.string() + ": " + errno_text());
    }
    file.storage_->bytes = file.storage_->owned;
  }
  ::close(fd);  // the mapping stays valid
  file.parse();
  return file;
}

SafetensorsFile SafetensorsFile::from_bytes(std::vector<std::byte> bytes, std::string source) {
  SafetensorsFile file;
  file.source_ = std::move(source);
  file.storage_ = std::make_unique<Storage>();
  file.storage_->owned = std::move(bytes);
  file.storage_->bytes = file.storage_->owned;
  file.parse();
  return file;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::vector<float> SafetensorsFile::to_f32(const TensorInfo& tensor) const {
  return convert_to_f32(tensor.dtype, tensor.data);
}
std::vector<double> SafetensorsFile::to_f64(const TensorInfo& tensor) const {
  return convert_to_f64(tensor.dtype, tensor.data);
}

void SafetensorsFile::parse() {
  const std::span<const std::byte> bytes = storage_->bytes;
  const std::string& src = source_;
  auto fail = [&](const std::string& what) -> void { throw Error(src + ": " + what); };
  if (bytes.size() < 8) {
    fail("file is " + std::to_string(bytes.size()) +
         " bytes, shorter than the 8-byte header length; it is truncated or not safetensors");
  }
  const auto n = load<std::uint64_t>(bytes.data());
  if (n > kMaxHeaderBytes) {
    fail("header length " + std::to_string(n) + " exceeds the limit of " +
         std::to_string(kMaxHeaderBytes) + " bytes; the file is corrupt or not safetensors");
  }
  if (n > bytes.size() - 8) {
    fail("header length " + std::to_string(n) + " runs past the end of the file (" +
         std::to_string(bytes.size()) + " bytes); the file is truncated");
  }
  header_bytes_ = n;
  const auto* text = reinterpret_cast<const char*>(bytes.data() + 8);
  if (n == 0 || text[0] != '{') fail("header does not start with '{'; not a safetensors file");

  // Duplicate keys are an error (nlohmann keeps the last silently): track the
  // keys of every open object while parsing.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  nlohmann::json header;
  // The format nests three levels: the header object (depth 0) holds entry objects
  // and __metadata__ (depth 1), entries hold the shape and data_offsets arrays
  // (depth 2). A container starting deeper is invalid; stopping there keeps a
  // crafted header from building a value every recursive walk would overflow on.
  constexpr int kMaxContainerDepth = 2;
  try {
    header = nlohmann::json::parse(
        text, text + n,
        [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
          using E = nlohmann::json::parse_event_t;
          if ((event == E::object_start || event == E::array_start) && depth > kMaxContainerDepth) {
            fail("header nests deeper than the " + std::to_string(kMaxContainerDepth + 1) +
                 " levels safetensors uses (header, tensor entry, shape/data_offsets); not a safetensors file");
          }
          if (event == E::object_start) open_objects.emplace_back();
          if (event == E::object_end && !open_objects.empty()) open_objects.pop_back();
          if (event == E::key && !open_objects.empty() &&
              !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
            duplicate = parsed.get<std::string>();
          }
          return true;
        });
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) fail("duplicate key '" + duplicate + "' in the header");
  if (!header.is_object()) fail("header is not a JSON object");

  const std::uint64_t buffer_bytes = bytes.size() - 8 - n;
  const std::byte* buffer = bytes.data() + 8 + n;
  struct Range {
    std::uint64_t begin, end;
    std::size_t index;
  };
  std::vector<Range> ranges;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (value.is_null()) continue;
      if (!value.is_object()) fail("__metadata__ is not an object of strings");
      for (const auto& [key, v] : value.items()) {
        if (!v.is_string()) fail("__metadata__ value of '" + key + "' is not a string: " + describe(v));
        metadata_[key] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!value.is_object()) fail(where + " is not an object: " + describe(value));
    const auto dtype_it = value.find("dtype");
    const auto shape_it = value.find("shape");
    const auto offsets_it = value.find("data_offsets");
    if (dtype_it == value.end() || shape_it == value.end() || offsets_it == value.end()) {
      fail(where + " lacks one of dtype, shape, data_offsets");
    }
    if (!dtype_it->is_string()) fail(where + ": dtype is not a string");
    const auto dtype = parse_dtype(dtype_it->get<std::string>());
    if (!dtype) {
      fail(where + ": unknown dtype " + describe(*dtype_it) +
           " (posembed reads BOOL, U8, I8, U16, I16, U32, I32, U64, I64, F16, BF16, F32, F64, "
           "F8_E4M3, F8_E5M2)");
    }
    if (!shape_it->is_array()) fail(where + ": shape is not an array");
    TensorInfo info;
    info.name = name;
    info.dtype = *dtype;
    bool overflow = false;
    std::uint64_t numel = 1;
    for (const auto& d : *shape_it) {
      if (!d.is_number_unsigned()) fail(where + ": shape entry " + describe(d) + " is not a non-negative integer");
      const auto dim = d.get<std::uint64_t>();
      if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) overflow = true;
      numel = checked_mul(numel, dim, overflow);
      info.shape.push_back(static_cast<std::int64_t>(dim));
    }
    const std::uint64_t expected = checked_mul(numel, dtype_size(*dtype), overflow);
    if (overflow || numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail(where + ": shape " + dims_text(*shape_it) + " overflows a 64-bit byte count");
    }
    if (!offsets_it->is_array() || offsets_it->size() != 2 || !(*offsets_it)[0].is_number_unsigned() ||
        !(*offsets_it)[1].is_number_unsigned()) {
      fail(where + ": data_offsets " + describe(*offsets_it) + " is not [begin, end]");
    }
    const auto begin = (*offsets_it)[0].get<std::uint64_t>();
    const auto end = (*offsets_it)[1].get<std::uint64_t>();
    if (end < begin) fail(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] end before begin");
    if (end > buffer_bytes) {
      fail(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
           "] run past the data buffer of " + std::to_string(buffer_bytes) + " bytes; the file is truncated");
    }
    if (end - begin != expected) {
      fail(where + ": " + std::string(dtype_name(*dtype)) + " shape " + dims_text(*shape_it) +
           " needs " + std::to_string(expected) + " bytes but data_offsets [" +
           std::to_string(begin) + ", " + std::to_string(end) + "] hold " +
           std::to_string(end - begin));
    }
    info.data = {buffer + begin, static_cast<std::size_t>(end - begin)};
    ranges.push_back({begin, end, tensors_.size()});
    tensors_.push_back(std::move(info));
  }

  // The data buffer must be covered exactly: sorted by offsets, each tensor
  // starts where the previous one ended and the last ends at the buffer's end.
  std::sort(ranges.begin(), ranges.end(), [&](const Range& a, const Range& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return tensors_[a.index].name < tensors_[b.index].name;
  });
  std::uint64_t covered = 0;
  for (const auto& r : ranges) {
    const std::string& name = tensors_[r.index].name;
    if (r.begin < covered) {
      fail("tensor '" + name + "' at [" + std::to_string(r.begin) + ", " + std::to_string(r.end) +
           ") overlaps the previous tensor, which ends at " + std::to_string(covered));
    }
    if (r.begin > covered) {
      fail("bytes [" + std::to_string(covered) + ", " + std::to_string(r.begin) +
           ") of the data buffer belong to no tensor (a hole before '" + name + "')");
    }
    covered = r.end;
  }
  if (covered != buffer_bytes) {
    fail("tensors cover " + std::to_string(covered) + " bytes but the data buffer holds " +
         std::to_string(buffer_bytes) + " (trailing bytes belong to no tensor)");
  }
  std::vector<TensorInfo> ordered;
  ordered.reserve(tensors_.size());
  for (const auto& r : ranges) ordered.push_back(std::move(tensors_[r.index]));
  tensors_ = std::move(ordered);
}

// ---- writing ----

namespace {

mode_t new_file_mode(const std::filesystem::path& target) {
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0) return st.st_mode & 07777;  // keep an existing file's mode
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "Umask:") {
      unsigned mask = 022;
      status >> std::oct >> mask;
      return static_cast<mode_t>(0666 & ~mask);
    }
  }
  return 0644;
}

void write_all(int fd, const std::byte* data, std::size_t size, const std::string& what) {
  while (size > 0) {
    const ssize_t written = ::write(fd, data, std::min<std::size_t>(size, std::size_t{1} << 30));
    if (written < 0) {
      if (errno == EINTR) continue;
      throw Error("writing " + what + " failed: " + errno_text());
    }
    data += written;
    size -= static_cast<std::size_t>(written);
  }
}

}  // namespace

void save_safetensors(const std::filesystem::path& path, std::span<const TensorToWrite> tensors,
                      const std::map<std::string, std::string>& metadata) {
  // Validate and build the header before touching the disk.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& meta = header["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
  }
  std::set<std::string_view> names;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    const std::string where = "tensor '" + t.name + "'";
    if (t.name == "__metadata__") throw Error(where + ": the name is reserved for the metadata");
    if (!names.insert(t.name).second) throw Error(where + " appears twice; names must be unique");
    bool overflow = false;
    std::uint64_t numel = 1;
    for (auto d : t.shape) {
      if (d < 0) throw Error(where + ": dimension " + std::to_string(d) + " is negative");
      numel = checked_mul(numel, static_cast<std::uint64_t>(d), overflow);
    }
    const std::uint64_t bytes = checked_mul(numel, dtype_size(t.dtype), overflow);
    if (overflow || bytes != t.data.size()) {
      throw Error(where + ": shape needs " + (overflow ? std::string("more than 2^64") : std::to_string(bytes)) +
                  " bytes of " + std::string(dtype_name(t.dtype)) + " but " +
                  std::to_string(t.data.size()) + " were given");
    }
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("a tensor name or metadata string is not valid UTF-8: ") + e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxHeaderBytes) {
    throw Error("header of " + std::to_string(text.size()) + " bytes exceeds the " +
                std::to_string(kMaxHeaderBytes) + "-byte limit readers enforce; use fewer tensors or less metadata");
  }

  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) {
    throw Error("cannot save to " + path.string() + ": it is a directory; name a file, such as " +
                (path / "model.safetensors").string());
  }
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";
  std::string tmp_name(1, '.');  // hidden, in the same directory: rename() stays atomic
  tmp_name += path.filename().string();
  tmp_name += ".tmp-XXXXXX";
  std::string tmp = (dir / tmp_name).string();
  const int fd = mkstemp(tmp.data());
  if (fd < 0) {
    throw Error("cannot create a temporary file in " + dir.string() + " to save " + path.string() +
                ": " + errno_text());
  }
  int open_fd = fd;  // -1 once closed, so the cleanup below never closes twice
  try {
    if (fchmod(fd, new_file_mode(path)) != 0) throw Error("chmod " + tmp + ": " + errno_text());
    std::byte length[8];
    const std::uint64_t n = text.size();
    std::memcpy(length, &n, 8);
    write_all(fd, length, 8, tmp);
    write_all(fd, reinterpret_cast<const std::byte*>(text.data()), text.size(), tmp);
    for (const auto& t : tensors) write_all(fd, t.data.data(), t.data.size(), tmp);
    if (fsync(fd) != 0) throw Error("fsync " + tmp + ": " + errno_text());
    open_fd = -1;
    if (::close(fd) != 0) throw Error("closing " + tmp + " failed: " + errno_text());
  } catch (...) {
    if (open_fd >= 0) ::close(open_fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw Error("cannot rename " + tmp + " to " + path.string() + ": " + why);
  }
  // Make the rename itself durable.
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    ::close(dir_fd);
  }
}

}  // namespace posembed::io
