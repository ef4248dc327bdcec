// Writes the PyTorch comparison's inputs: our initial checkpoint and 10 batches
// with the training settings (usage: gpt_torch_export OUT_DIR); no learning
// rates: the reference derives its own schedule from the settings. The same
// settings are rebuilt by torch_compare_test.cpp through torch_case.h.
#include <cstdio>
#include <filesystem>

#include "posembed/io/safetensors.h"
#include "posembed/model/checkpoint.h"
#include "torch_case.h"

int main(int argc, char** argv) {
  using namespace posembed;
  if (argc != 2) {
    std::fprintf(stderr, "usage: gpt_torch_export OUT_DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  const model::testing::TorchCase c = model::testing::make_torch_case();
  const model::Gpt gpt = model::make_gpt(c.model);
  model::save_checkpoint(dir / "torch_init.safetensors", gpt,
                         {c.model, c.train, 0, "synthetic", false, "", ""}, {}, {});
  const std::vector<std::int64_t> shape{c.train.steps, c.batch, c.seq_len};
  const io::TensorToWrite tensors[] = {
      {"inputs", io::DType::I64, shape, std::as_bytes(std::span(c.inputs))},
      {"targets", io::DType::I64, shape, std::as_bytes(std::span(c.targets))}};
  std::map<std::string, std::string> meta;
  visit_fields(const_cast<model::TrainConfig&>(c.train), [&](const char* name, auto& field, const char*) {
    meta[name] = field_to_string(field);
  });
  io::save_safetensors(dir / "torch_batches.safetensors", tensors, meta);
  std::printf("wrote %s\n", (dir / "torch_init.safetensors").c_str());
  return 0;
}
