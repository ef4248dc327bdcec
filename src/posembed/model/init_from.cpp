#include "posembed/model/init_from.h"

#include <algorithm>
#include <map>

#include "posembed/core/error.h"
#include "posembed/io/safetensors.h"

namespace posembed::model {
namespace {

// The file's float dtype, "F16"; with tensors of other dtypes, the most common
// one and the others by name: "F32 (wpe.weight BF16)". A mixed file loads
// widened all the same; the label says so rather than naming one table's dtype.
std::string dtypes_text(const io::SafetensorsFile& file) {
  std::map<io::DType, std::vector<std::string>> names;
  for (const io::TensorInfo& t : file.tensors()) {
    if (io::is_float(t.dtype)) names[t.dtype].push_back(t.name);
  }
  if (names.empty()) return "no float tensors";
  const auto most = std::max_element(names.begin(), names.end(), [](const auto& a, const auto& b) {
    return a.second.size() < b.second.size();
  });
  std::string text(io::dtype_name(most->first)), others;
  for (const auto& [dtype, list] : names) {
    if (dtype == most->first) continue;
    for (std::size_t i = 0; i < list.size() && i < 3; ++i) {
      others += (others.empty() ? "" : ", ") + list[i] + " " + std::string(io::dtype_name(dtype));
    }
    if (list.size() > 3) {
      others +=
          " and " + std::to_string(list.size() - 3) + " more " + std::string(io::dtype_name(dtype));
    }
  }
  return others.empty() ? text : text + " (" + others + ")";
}

bool is_trainer(const io::SafetensorsFile& file) {
  const auto format = file.metadata().find("format");
  return format != file.metadata().end() && format->second == kCheckpointFormat;
}

InitSource inspect(const io::SafetensorsFile& file, const GptConfig& fallback) {
  const std::string& src = file.source();
  InitSource s;
  if (is_trainer(file)) {
    s.trainer = read_checkpoint_info(src);
    s.config = s.trainer->model;
    s.kind = "trainer checkpoint at step " + std::to_string(s.trainer->step);
    return s;
  }
  for (const char* prefix : {"", "transformer."}) {
    if (file.find(std::string(prefix) + "wte.weight")) {
      s.prefix = prefix;
      break;
    }
  }
  const io::TensorInfo* wte = file.find(s.prefix + "wte.weight");
  const io::TensorInfo* wpe = file.find(s.prefix + "wpe.weight");
  if (!wte || !wpe) {
    throw Error(src +
                ": no GPT-2 token and position tables (wte.weight and wpe.weight, bare or "
                "under 'transformer.'); --init-from takes a posembed trainer checkpoint or a "
                "GPT-2-named safetensors file");
  }
  if (wte->shape.size() != 2 || wpe->shape.size() != 2 || wte->shape[1] != wpe->shape[1]) {
    throw Error(src + ": wte.weight " + io::shape_text(wte->shape) + " and wpe.weight " +
                io::shape_text(wpe->shape) + " are not two tables of the same width");
  }
  s.config = fallback;
  s.config.embedding.vocab_size = wte->shape[0];
  s.config.embedding.embed_dim = wte->shape[1];
  s.config.embedding.max_seq_len = wpe->shape[0];
  s.config.n_layer = 0;
  while (file.find(s.prefix + "h." + std::to_string(s.config.n_layer) + ".ln_1.weight")) {
    ++s.config.n_layer;
  }
  if (s.config.embedding.vocab_size != fallback.embedding.vocab_size) {
    throw Error(src + ": its token table has " + std::to_string(s.config.embedding.vocab_size) +
                " rows but the trainer's vocabulary is bytes (" +
                std::to_string(fallback.embedding.vocab_size) +
                "); --init-from needs a byte-level model");
  }
  s.kind = "GPT-2 names, " + dtypes_text(file);
  s.position_dtype = wpe->dtype;
  return s;
}

}  // namespace

bool is_trainer_checkpoint(const std::filesystem::path& path) {
  return is_trainer(io::SafetensorsFile::open(path));
}

InitSource inspect_init_source(const std::filesystem::path& path, const GptConfig& fallback) {
  return inspect(io::SafetensorsFile::open(path), fallback);
}

InitFrom init_from(const std::filesystem::path& path, const GptConfig& config,
                   const std::optional<PositionResize>& resize, bool allow_non_finite) {
  const io::SafetensorsFile file = io::SafetensorsFile::open(path);
  const InitSource source = inspect(file, config);
  const std::string& src = file.source();
  const auto same = [&](const char* flag, std::int64_t want, std::int64_t have) {
    if (want != have) {
      throw Error(src + " has " + flag + " " + std::to_string(have) + " but the run asks for " +
                  std::to_string(want) + ": --init-from keeps the source's architecture (drop --" +
                  flag + " or set it to " + std::to_string(have) + ")");
    }
  };
  same("embed-dim", config.embedding.embed_dim, source.config.embedding.embed_dim);
  same("n-layer", config.n_layer, source.config.n_layer);
  if (source.trainer) same("n-head", config.n_head, source.config.n_head);
  const std::int64_t from = source.config.embedding.max_seq_len, to = config.embedding.max_seq_len;
  if (from != to && !resize) {
    throw Error(src + " has " + std::to_string(from) + " positions and the run asks for " +
                std::to_string(to) +
                ": say how to make the table with --extend tile, "
                "interpolate or init (crop or interpolate to shrink it)");
  }
  GptConfig at_source = config;
  at_source.embedding.max_seq_len = from;
  Gpt model = make_gpt(at_source);

  // Validate every tensor first, then convert and copy: a bad file changes nothing.
  std::vector<std::pair<const io::TensorInfo*, const ParamTensor*>> plan;
  for (const ParamTensor& t : model.tensors) {
    const io::TensorInfo* ti = file.find(source.prefix + t.name);
    if (!ti) throw Error(src + ": tensor '" + source.prefix + t.name + "' is missing");
    if (ti->shape != t.shape || !io::is_float(ti->dtype)) {
      throw Error(src + ": tensor '" + ti->name + "' is " + std::string(io::dtype_name(ti->dtype)) +
                  " " + io::shape_text(ti->shape) + "; this model needs a float tensor of shape " +
                  io::shape_text(t.shape));
    }
    plan.emplace_back(ti, &t);
  }
  InitFrom out;
  for (const io::TensorInfo& ti : file.tensors()) {
    const bool used =
        std::any_of(plan.begin(), plan.end(), [&](auto& p) { return p.first == &ti; });
    if (!used && !ti.name.starts_with("optimizer.")) {
      out.notes.push_back("ignored '" + ti.name + "' " + io::shape_text(ti.shape) +
                          (ti.name.ends_with("lm_head.weight")
                               ? " (the output layer is tied to wte)"
                               : " (not a parameter of this model)"));
    }
  }
  for (const auto& [ti, t] : plan) {
    const std::vector<float> values = file.to_f32(*ti);
    if (!allow_non_finite) require_finite(src, ti->name, std::as_bytes(std::span(values)));
    std::copy(values.begin(), values.end(),
              model.params.begin() + static_cast<std::ptrdiff_t>(t->offset));
  }
  out.origin = path.string() + " (" + source.kind + ")";
  if (resize && from == to) {
    out.notes.push_back("--extend has nothing to do: the run keeps the source's " +
                        std::to_string(from) + " positions (give --max-seq-len to change them)");
  }
  if (from != to) {
    out.model = resize_positions(model, to, *resize);
    out.origin += ", position table " + describe(*resize, from, to);
  } else {
    out.model = std::move(model);
  }
  return out;
}

}  // namespace posembed::model
