#include "posembed/model/extend.h"

#include <algorithm>
#include <cstring>

#include "posembed/core/error.h"
#include "posembed/io/safetensors.h"
#include "posembed/model/checkpoint.h"

namespace posembed::model {

std::string describe(const PositionResize& r, std::int64_t from, std::int64_t to) {
  std::string text = std::string(io::to_string(r.method)) + " " + std::to_string(from) + " -> " +
                     std::to_string(to);
  if (r.method == io::ResizeMethod::init) {
    text += " (new rows " + to_string(r.init) + ", seed " + std::to_string(r.seed) + ")";
  }
  return text;
}

Gpt resize_positions(const Gpt& model, std::int64_t max_seq_len, const PositionResize& resize) {
  const GptConfig& c = model.config;
  io::RowResize rows{.offset_rows = 0,
                     .old_len = c.embedding.max_seq_len,
                     .new_len = max_seq_len,
                     .embed_dim = c.embedding.embed_dim,
                     .method = resize.method,
                     .init = resize.init,
                     .seed = resize.seed};
  io::validate_resize(rows);
  GptConfig config = c;
  config.embedding.max_seq_len = max_seq_len;
  Gpt out = make_gpt(config);  // validates the new length; its initial values are overwritten
  out.freeze_positions = model.freeze_positions;
  const ParamTensor& old_wpe = *find_tensor(model, "wpe.weight");
  const ParamTensor& new_wpe = *find_tensor(out, "wpe.weight");
  // Every other tensor has the same shape in both models, in the same order.
  for (std::size_t k = 0; k < model.tensors.size(); ++k) {
    const ParamTensor& from = model.tensors[k];
    const ParamTensor& to = out.tensors[k];
    if (&from == &old_wpe) continue;
    for (auto [src, dst] : {std::pair{model.params, out.params}, std::pair{model.m, out.m},
                            std::pair{model.v, out.v}}) {
      std::copy_n(src.begin() + static_cast<std::ptrdiff_t>(from.offset), from.numel,
                  dst.begin() + static_cast<std::ptrdiff_t>(to.offset));
    }
  }
  const auto resize_table = [&](std::span<const float> src, std::span<float> dst,
                                const io::RowResize& how) {
    const std::vector<std::byte> bytes = io::resize_rows(
        std::as_bytes(src.subspan(old_wpe.offset, old_wpe.numel)), io::DType::F32, how);
    std::memcpy(dst.data() + new_wpe.offset, bytes.data(), bytes.size());
  };
  resize_table(model.params, out.params, rows);
  // The moments of new rows drawn by `init` start at zero: zeros:0 draws exactly that.
  io::RowResize moments = rows;
  moments.init = TableInit{InitKind::zeros, 0.0};
  resize_table(model.m, out.m, moments);
  resize_table(model.v, out.v, moments);
  return out;
}

CheckpointResize resize_trainer_checkpoint(const std::filesystem::path& in,
                                           const std::filesystem::path& out,
                                           std::int64_t max_seq_len, const PositionResize& resize,
                                           bool allow_non_finite) {
  CheckpointResize r;
  r.moments = io::SafetensorsFile::open(in).find("optimizer.exp_avg.wpe.weight") != nullptr;
  Checkpoint info;
  const Gpt model = load_checkpoint(in, &info, r.moments, allow_non_finite);
  r.old_len = info.model.embedding.max_seq_len;
  r.new_len = max_seq_len;
  const Gpt resized = resize_positions(model, max_seq_len, resize);
  info.model.embedding.max_seq_len = max_seq_len;
  if (info.train.seq_len > max_seq_len) {
    r.notes.push_back("training window seq_len " + std::to_string(info.train.seq_len) +
                      " is longer than the new table: set to 0 (= max_seq_len)");
    info.train.seq_len = 0;
  }
  const std::string step = describe(resize, r.old_len, max_seq_len);
  info.origin += (info.origin.empty() ? "" : "; then ") + std::string("resized from ") +
                 in.string() + " at step " + std::to_string(info.step) + ", " + step;
  if (!r.moments) {
    r.notes.push_back("no AdamW moments in the file: it loads in --init-from, not --resume");
  } else {
    r.notes.push_back(
        std::string("AdamW moments resized with the table") +
        (resize.method == io::ResizeMethod::init ? " (the new rows' moments start at zero)" : "") +
        "; --resume continues at step " + std::to_string(info.step));
  }
  save_checkpoint(out, resized, info, r.moments ? resized.m : std::span<const float>(),
                  r.moments ? resized.v : std::span<const float>());
  return r;
}

}  // namespace posembed::model
