// libFuzzer target for the trainer's checkpoint loader, the path behind
// `train --resume`, `--init-from`, eval and sample: metadata into settings,
// the settings checked against the file, a model made from them, every tensor
// validated and copied in. Any input either loads into a model whose
// parameters are all finite and whose settings survive a round trip through
// the metadata, or throws posembed::Error. Anything else (a crash, another
// exception, an allocation past libFuzzer's limit, a sanitizer report) is a
// bug. Built by tests/fuzz/CMakeLists.txt with clang when given the main build.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "posembed/core/error.h"
#include "posembed/io/safetensors.h"
#include "posembed/model/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace model = posembed::model;
  std::vector<std::byte> bytes(size);
  if (size > 0) std::memcpy(bytes.data(), data, size);
  try {
    const auto file = posembed::io::SafetensorsFile::from_bytes(std::move(bytes), "fuzz");
    // As resize and --resume take them: with the moments when the file has them.
    const bool with_optimizer = file.find("optimizer.exp_avg.wpe.weight") != nullptr;
    model::Checkpoint info;
    const model::Gpt gpt = model::load_checkpoint(file, &info, with_optimizer);
    // Every parameter came from the file: the model is no larger than it.
    if (gpt.num_params * sizeof(float) > size) std::abort();
    if (!std::all_of(gpt.params.begin(), gpt.params.end(),
                     [](float x) { return std::isfinite(x); })) {
      std::abort();
    }
    // Compared as text: a NaN setting is one too (NaN != NaN as a double).
    const auto meta = model::checkpoint_metadata(info);
    if (model::checkpoint_metadata(model::checkpoint_from_metadata(meta, "round trip")) != meta) {
      std::abort();
    }
  } catch (const posembed::Error&) {
  }
  return 0;
}
