// libFuzzer target for the safetensors parser: any input either parses into
// tensors whose views lie inside the input and convert cleanly, or throws
// posembed::Error. Anything else (a crash, another exception, a sanitizer
// report) is a bug. Built by tests/fuzz/CMakeLists.txt with clang.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "posembed/core/error.h"
#include "posembed/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::byte> bytes(size);
  if (size > 0) std::memcpy(bytes.data(), data, size);
  try {
    const auto file = posembed::io::SafetensorsFile::from_bytes(std::move(bytes), "fuzz");
    std::uint64_t covered = 0;
    for (const auto& t : file.tensors()) {
      covered += t.data.size();
      const auto values = file.to_f32(t);
      if (static_cast<std::int64_t>(values.size()) != t.numel()) std::abort();
      if (!values.empty()) {
        volatile float sink = values.front() + values.back();
        (void)sink;
      }
      if (file.find(t.name) == nullptr) std::abort();
    }
    if (covered + file.header_bytes() + 8 != file.file_bytes()) std::abort();  // exact coverage
  } catch (const posembed::Error&) {
  }
  return 0;
}
