#include "posembed/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <utility>

#include "posembed/core/error.h"
#include "posembed/core/init.h"
#include "posembed/core/layer.h"
#include "posembed/core/parallel_for.h"
#include "posembed/core/position_ids.h"
#include "posembed/core/sizes.h"
#include "posembed/model/ops.h"
#include "posembed/model/row_ops.h"

namespace posembed::model {
namespace {

// n values of T rounded up to whole cache lines: where spans carved one after
// another from a buffer that starts on a line (core/aligned.h) each start on
// one, so the row loops' vectors do not straddle two lines.
template <class T>
std::int64_t on_lines(std::int64_t n) {
  constexpr auto kPerLine = static_cast<std::int64_t>(kLineBytes / sizeof(T));
  return (n + kPerLine - 1) / kPerLine * kPerLine;
}

// Carves consecutive spans out of one buffer, each on a line: first a
// counting pass (base == nullptr), then the real one.
struct Carver {
  float* base = nullptr;
  std::size_t used = 0;
  double counted = 0;  // `used` in double: cannot wrap, so it can be checked against memory
  std::span<float> take(std::int64_t n) {
    std::span<float> s = base ? std::span<float>(base + used, sz(n)) : std::span<float>();
    const std::int64_t padded = on_lines<float>(n);
    used += sz(padded);
    counted += static_cast<double>(padded);
    return s;
  }
};

constexpr std::int64_t kSitesPerLayer = 2;  // residual dropout after attention and after the MLP

// Values in each half of a bf16 scratch: the widest activation a product reads
// (the MLP's 4C) or the logits' gradient (V), over N rows.
std::int64_t bf16_scratch_half(const GptConfig& c, std::int64_t N) {
  return N * std::max(4 * c.embedding.embed_dim, c.embedding.vocab_size);
}

// Whether the products run in bf16: transposed weights made for it.
bool bf16_products(const TransposedWeights* t) {
  return t != nullptr && t->precision == Precision::bf16;
}

// Values per token of Activations::bf16_inputs: each block's ln_1, atty, ln_2
// (C each) and fch_gelu (4C), and ln_f. Not counted: the padding that puts
// each span on a cache line (under a line a span; make_activations adds it).
std::int64_t bf16_inputs_per_token(const GptConfig& c) {
  return (8 * c.n_layer + 1) * c.embedding.embed_dim;
}

// The bf16 operands of a product by `weight` (a view into model.params) and
// `weight_t`, its transpose (a view into t->memory): the same places in their
// rounded copies; `input`, where the product keeps its rounded input
// (Activations::bf16_inputs). None (fp32 products) without bf16 weights.
Bf16Operands bf16_operands(const Gpt& model, const TransposedWeights* t, Activations& a,
                           std::span<const float> weight, std::span<const float> weight_t,
                           std::span<std::uint16_t> input) {
  if (!bf16_products(t)) return {};
  const auto same_place = [](const LineVector<std::uint16_t>& copy, const float* base,
                             std::span<const float> view) {
    return std::span<const std::uint16_t>(copy.data() + (view.data() - base), view.size());
  };
  return {same_place(t->params_bf16, model.params.data(), weight),
          same_place(t->memory_bf16, t->memory.data(), weight_t), a.bf16_scratch, input};
}

// Throws unless bf16 weights come with activations that have the bf16 scratch.
void check_precision(const TransposedWeights* t, const Activations& a) {
  if (bf16_products(t) && a.bf16_scratch.empty()) {
    throw Error(
        "the transposed weights were made for bf16 products but the activations for "
        "fp32; make the activations with Precision::bf16 too");
  }
}

}  // namespace

void validate(const GptConfig& c) {
  validate(c.embedding);
  if (c.embedding.vocab_size != 256) {
    throw Error("vocab_size = " + std::to_string(c.embedding.vocab_size) +
                " but the trainer's vocabulary is bytes: use 256");
  }
  if (c.n_layer < 1 || c.n_layer > 1024) {
    throw Error("n_layer = " + std::to_string(c.n_layer) + " must lie in [1, 1024]");
  }
  if (c.n_head < 1 || c.embedding.embed_dim % c.n_head != 0) {
    throw Error("n_head = " + std::to_string(c.n_head) + " must be >= 1 and divide embed_dim = " +
                std::to_string(c.embedding.embed_dim) + "; pick a divisor such as " +
                std::to_string(std::gcd(c.embedding.embed_dim, std::int64_t{4})));
  }
  if (c.embedding.max_seq_len > 65536 || c.embedding.embed_dim > 65536) {
    throw Error("max_seq_len " + std::to_string(c.embedding.max_seq_len) + " and embed_dim " +
                std::to_string(c.embedding.embed_dim) + " must be <= 65536 for this trainer");
  }
}

ParamRange param_shard(std::size_t num_params, int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    throw Error("shard " + std::to_string(rank) + " of " + std::to_string(ranks) +
                ": need 0 <= rank < ranks");
  }
  const std::size_t pieces = (num_params + kParamPiece - 1) / kParamPiece;
  const auto edge = [&](int r) {
    const std::size_t piece = pieces * static_cast<std::size_t>(r) / static_cast<std::size_t>(ranks);
    return std::min(num_params, piece * kParamPiece);
  };
  return {edge(rank), edge(rank + 1)};
}

ParamViews param_views(const Gpt& model, std::span<float> buffer) {
  if (buffer.size() != model.num_params) {
    throw Error("a parameter buffer holds " + std::to_string(buffer.size()) +
                " floats but the model has " + std::to_string(model.num_params) +
                " parameters; give it a buffer of model.num_params floats");
  }
  const auto view = [&](const std::string& name) {
    return tensor_view(model, buffer, *find_tensor(model, name));
  };
  ParamViews views;
  views.wte = view("wte.weight");
  views.wpe = view("wpe.weight");
  views.h.resize(sz(model.config.n_layer));
  for (std::int64_t l = 0; l < model.config.n_layer; ++l) {
    BlockViews& b = views.h[sz(l)];
    const std::string h = "h." + std::to_string(l) + ".";
    b.ln_1_w = view(h + "ln_1.weight"); b.ln_1_b = view(h + "ln_1.bias");
    b.c_attn_w = view(h + "attn.c_attn.weight"); b.c_attn_b = view(h + "attn.c_attn.bias");
    b.attn_proj_w = view(h + "attn.c_proj.weight"); b.attn_proj_b = view(h + "attn.c_proj.bias");
    b.ln_2_w = view(h + "ln_2.weight"); b.ln_2_b = view(h + "ln_2.bias");
    b.c_fc_w = view(h + "mlp.c_fc.weight"); b.c_fc_b = view(h + "mlp.c_fc.bias");
    b.mlp_proj_w = view(h + "mlp.c_proj.weight"); b.mlp_proj_b = view(h + "mlp.c_proj.bias");
  }
  views.ln_f_w = view("ln_f.weight");
  views.ln_f_b = view("ln_f.bias");
  return views;
}

std::vector<ParamTensor> gpt_layout(const GptConfig& config) {
  validate(config);
  const std::int64_t C = config.embedding.embed_dim, V = config.embedding.vocab_size;
  // Canonical (Hugging Face) order, then laid out with every decayed 2-D weight
  // first: the optimizer then runs over two contiguous ranges, not 4 + 12 L tensors.
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> specs;
  const auto add = [&](std::string name, std::vector<std::int64_t> shape) {
    specs.emplace_back(std::move(name), std::move(shape));
  };
  add("wte.weight", {V, C});
  add("wpe.weight", {config.embedding.max_seq_len, C});
  for (std::int64_t l = 0; l < config.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    add(h + "ln_1.weight", {C});
    add(h + "ln_1.bias", {C});
    add(h + "attn.c_attn.weight", {C, 3 * C});
    add(h + "attn.c_attn.bias", {3 * C});
    add(h + "attn.c_proj.weight", {C, C});
    add(h + "attn.c_proj.bias", {C});
    add(h + "ln_2.weight", {C});
    add(h + "ln_2.bias", {C});
    add(h + "mlp.c_fc.weight", {C, 4 * C});
    add(h + "mlp.c_fc.bias", {4 * C});
    add(h + "mlp.c_proj.weight", {4 * C, C});
    add(h + "mlp.c_proj.bias", {C});
  }
  add("ln_f.weight", {C});
  add("ln_f.bias", {C});
  std::vector<ParamTensor> tensors;
  std::size_t offset = 0;
  for (const bool decay : {true, false}) {
    for (const auto& [name, shape] : specs) {
      if ((shape.size() == 2) != decay) continue;
      std::size_t n = 1;
      for (auto d : shape) n *= sz(d);
      tensors.push_back({name, shape, offset, n, decay});
      offset += n;
    }
  }
  return tensors;
}

Gpt make_gpt(const GptConfig& config, MomentShard shard) {
  Gpt model;
  model.config = config;
  model.tensors = gpt_layout(config);
  const std::int64_t C = config.embedding.embed_dim;
  std::size_t offset = 0;
  for (const ParamTensor& t : model.tensors) {
    offset += t.numel;
    if (t.decay) model.num_decayed = offset;
  }
  model.num_params = offset;
  model.moments = param_shard(offset, shard.rank, shard.ranks);
  const std::size_t held = model.moments.size();
  // validate() bounds the shapes, so this product cannot overflow.
  const std::uint64_t bytes = (2 * offset + 2 * held) * sizeof(float);
  check_fits_in_memory(bytes,
                       "the model needs " + std::to_string(bytes) + " bytes (" +
                           std::to_string(offset) + " parameters, their gradients and AdamW m "
                           "and v of " + std::to_string(held) + " of them, fp32)",
                       shard.ranks > 1 ? "use more ranks, or reduce n_layer, embed_dim or max_seq_len"
                                       : "reduce n_layer, embed_dim or max_seq_len");
  assign_zeros_huge(model.memory, 2 * offset + 2 * held);
  float* base = model.memory.data();
  model.params = {base, offset};
  model.grads = {base + offset, offset};
  model.m = {base + 2 * offset, held};
  model.v = {base + 2 * offset + held, held};

  model.p = param_views(model, model.params);
  model.g = param_views(model, model.grads);

  // Initialisation. Every tensor draws from its own range of Philox indices.
  init_table(model.p.wte, config.embedding.token_init, C, config.embedding.seed,
             RandomStream::token_init);
  init_table(model.p.wpe, config.embedding.position_init, C, config.embedding.seed,
             RandomStream::position_init);
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  for (const ParamTensor& t : model.tensors) {
    if (t.name == "wte.weight" || t.name == "wpe.weight") continue;
    std::span<float> view = model.params.subspan(t.offset, t.numel);
    if (t.decay) {
      const bool proj = t.name.ends_with("c_proj.weight");  // GPT-2's scaled residual init
      init_table(view, TableInit{InitKind::normal, proj ? proj_std : 0.02}, C,
                 config.embedding.seed, RandomStream::model_init, t.offset);
    } else {
      std::fill(view.begin(), view.end(), t.name.ends_with("ln_1.weight") ||
                                                  t.name.ends_with("ln_2.weight") ||
                                                  t.name == "ln_f.weight"
                                              ? 1.0f
                                              : 0.0f);
    }
  }
  return model;
}

const ParamTensor* find_tensor(const Gpt& model, std::string_view name) {
  for (const auto& t : model.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::span<float> tensor_view(const Gpt&, std::span<float> buffer, const ParamTensor& t) {
  return buffer.subspan(t.offset, t.numel);
}

Activations make_activations(const GptConfig& c, std::int64_t B, std::int64_t T,
                             Precision precision) {
  if (B < 1 || T < 1 || T > c.embedding.max_seq_len) {
    throw Error("activations for batch " + std::to_string(B) + " x seq_len " + std::to_string(T) +
                ": need batch >= 1 and 1 <= seq_len <= max_seq_len = " +
                std::to_string(c.embedding.max_seq_len));
  }
  Activations a;
  a.config = c;
  a.batch = B;
  a.seq_len = T;
  const std::int64_t C = c.embedding.embed_dim, H = c.n_head, V = c.embedding.vocab_size;
  // B and T come from flags: a huge batch must end in an error naming the bytes,
  // not in std::bad_alloc. Past 2^52 elements per buffer no memory holds them and
  // the counts below could wrap, so that is refused first.
  const double tokens = static_cast<double>(B) * static_cast<double>(T),
               scores = tokens * static_cast<double>(H * T);
  const std::string what = "activations for batch " + std::to_string(B) + " x seq_len " +
                           std::to_string(T) + " (" + std::to_string(c.n_layer) +
                           " layers, width " + std::to_string(C) + ")";
  const char* fix = "use a smaller batch (--batch-size) or sequence length (--seq-len)";
  if (std::max(tokens * 4.0 * static_cast<double>(C), scores) > 0x1p52) {
    throw Error(what + " need more than 2^54 bytes; " + fix);
  }
  const std::int64_t N = B * T;
  a.layers.resize(sz(c.n_layer));
  for (int pass = 0; pass < 2; ++pass) {
    Carver k{pass == 0 ? nullptr : a.memory.data(), 0};
    a.encoded = k.take(N * C);
    for (auto& l : a.layers) {
      l.ln_1 = k.take(N * C); l.ln_1_mean = k.take(N); l.ln_1_rstd = k.take(N);
      l.qkv = k.take(N * 3 * C); l.atty = k.take(N * C); l.att = k.take(B * H * T * T);
      l.attproj = k.take(N * C); l.residual2 = k.take(N * C);
      l.ln_2 = k.take(N * C); l.ln_2_mean = k.take(N); l.ln_2_rstd = k.take(N);
      l.fch_dgelu = k.take(N * 4 * C); l.fch_gelu = k.take(N * 4 * C);
      l.mlpproj = k.take(N * C); l.residual3 = k.take(N * C);
    }
    a.ln_f = k.take(N * C); a.ln_f_mean = k.take(N); a.ln_f_rstd = k.take(N);
    a.logits = k.take(N * V); a.probs = k.take(N * V); a.losses = k.take(N);
    a.d_residual = k.take(N * C); a.d_ln = k.take(N * C); a.d_atty = k.take(N * C);
    a.d_attproj = k.take(N * C); a.d_qkv = k.take(N * 3 * C); a.d_att = k.take(B * H * T * T);
    a.d_fch = k.take(N * 4 * C); a.d_mlpproj = k.take(N * C);
    a.d_logits = k.take(N * V); a.d_losses = k.take(N);
    if (pass == 0) {
      // Also the embedding's mask bits, and the batch's input and target ids
      // (int64) that callers hold beside them.
      const double scratch =
          precision == Precision::bf16
              ? 2.0 * (tokens * static_cast<double>(2 * bf16_scratch_half(c, 1) +
                                                    bf16_inputs_per_token(c)) +
                       static_cast<double>(c.n_layer * attention_bf16_values(B, T, C, H)))
              : 0.0;
      const auto bytes = static_cast<std::uint64_t>(
          4.0 * k.counted + tokens * static_cast<double>(C) / 8.0 + 16.0 * tokens + scratch);
      char gib[32];
      std::snprintf(gib, sizeof gib, "%.1f GiB", static_cast<double>(bytes) / 0x1p30);
      check_fits_in_memory(bytes, what + " need " + std::to_string(bytes) + " bytes (" + gib + ")",
                           fix);
      assign_zeros_huge(a.memory, k.used);
    }
  }
  if (precision == Precision::bf16) {
    a.bf16_scratch.assign(2 * sz(bf16_scratch_half(c, N)), 0);
    // bf16_inputs_per_token's spans, each on a line.
    const std::int64_t NC = on_lines<std::uint16_t>(N * C);
    a.bf16_inputs.assign(sz(c.n_layer * (3 * NC + on_lines<std::uint16_t>(N * 4 * C)) + NC), 0);
    std::span<std::uint16_t> rest(a.bf16_inputs);
    const auto take = [&](std::int64_t n) {
      const std::span<std::uint16_t> part = rest.first(sz(n));
      rest = rest.subspan(sz(on_lines<std::uint16_t>(n)));
      return part;
    };
    for (auto& l : a.layers) {
      l.ln_1_bf16 = take(N * C);
      l.atty_bf16 = take(N * C);
      l.ln_2_bf16 = take(N * C);
      l.fch_gelu_bf16 = take(N * 4 * C);
    }
    a.ln_f_bf16 = take(N * C);
    const std::int64_t packs = attention_bf16_values(B, T, C, H);
    const std::size_t stride = sz(on_lines<std::uint16_t>(packs));
    a.bf16_attention.assign(sz(c.n_layer) * stride, 0);
    for (std::size_t l = 0; l < a.layers.size(); ++l) {
      a.layers[l].attention_bf16 = std::span(a.bf16_attention).subspan(l * stride, sz(packs));
    }
  }
  a.positions.resize(sz(N));
  positions_contiguous(a.positions, B, T, 0);
  a.embedding_mask.resize(
      dropout_mask_words({B, T, c.embedding.vocab_size, c.embedding.max_seq_len, C}));
  return a;
}

TransposedWeights make_transposed_weights(const GptConfig& c, Precision precision) {
  validate(c);
  TransposedWeights t;
  t.config = c;
  t.precision = precision;
  const std::int64_t C = c.embedding.embed_dim;
  t.h.resize(sz(c.n_layer));
  for (int pass = 0; pass < 2; ++pass) {
    Carver k{pass == 0 ? nullptr : t.memory.data(), 0};
    t.wte = k.take(c.embedding.vocab_size * C);
    for (auto& b : t.h) {
      b.c_attn_w = k.take(3 * C * C); b.attn_proj_w = k.take(C * C);
      b.c_fc_w = k.take(4 * C * C); b.mlp_proj_w = k.take(4 * C * C);
    }
    if (pass == 0) {
      const auto bytes = static_cast<std::uint64_t>(4.0 * k.counted);
      check_fits_in_memory(bytes, "the transposed weights need " + std::to_string(bytes) + " bytes",
                           "reduce n_layer, embed_dim or vocab_size");
      assign_zeros_huge(t.memory, k.used);
      if (precision == Precision::bf16) t.memory_bf16.assign(k.used, 0);
    }
  }
  return t;
}

void transpose_weights(TransposedWeights& out, const Gpt& model) {
  const GptConfig& c = model.config;
  check_buffers_fit(c, out.config, "the transposed weights");
  const std::int64_t C = c.embedding.embed_dim;
  // Task 0 is the token table, task 1 + 4 l + k layer l's k-th weight.
  parallel_for(1 + 4 * c.n_layer, [&](std::int64_t task) {
    const auto transpose = [](std::span<float> to, std::span<const float> from, std::int64_t rows,
                              std::int64_t cols) {
      model::transpose(to.data(), from.data(), sz(rows), sz(cols), sz(cols));
    };
    if (task == 0) return transpose(out.wte, model.p.wte, c.embedding.vocab_size, C);
    const BlockViews& w = model.p.h[sz((task - 1) / 4)];
    TransposedWeights::Block& t = out.h[sz((task - 1) / 4)];
    switch ((task - 1) % 4) {
      case 0: return transpose(t.c_attn_w, w.c_attn_w, C, 3 * C);
      case 1: return transpose(t.attn_proj_w, w.attn_proj_w, C, C);
      case 2: return transpose(t.c_fc_w, w.c_fc_w, C, 4 * C);
      default: return transpose(t.mlp_proj_w, w.mlp_proj_w, 4 * C, C);
    }
  });
  if (out.precision != Precision::bf16) return;
  // The parameters' count is the model's, not the config's alone: sized on the
  // first step, then reused.
  out.params_bf16.resize(model.num_params);
  constexpr std::size_t kChunk = std::size_t{1} << 16;
  const std::size_t P = model.num_params, Q = out.memory.size();
  const auto chunks = [&](std::size_t n) {
    return static_cast<std::int64_t>((n + kChunk - 1) / kChunk);
  };
  parallel_for(chunks(P) + chunks(Q), [&](std::int64_t task) {
    const bool params = task < chunks(P);
    const std::size_t begin = sz(params ? task : task - chunks(P)) * kChunk;
    const std::span<const float> from =
        params ? std::span<const float>(model.params) : std::span<const float>(out.memory);
    std::span<std::uint16_t> to = params ? std::span(out.params_bf16) : std::span(out.memory_bf16);
    const std::size_t n = std::min(kChunk, from.size() - begin);
    round_to_bf16(to.subspan(begin, n), from.subspan(begin, n));
  });
}

void check_buffers_fit(const GptConfig& c, const GptConfig& made, const char* what) {
  struct Dim {
    const char* name;
    std::int64_t made, is;
  };
  const Dim dims[] = {{"vocab_size", made.embedding.vocab_size, c.embedding.vocab_size},
                      {"max_seq_len", made.embedding.max_seq_len, c.embedding.max_seq_len},
                      {"embed_dim", made.embedding.embed_dim, c.embedding.embed_dim},
                      {"n_layer", made.n_layer, c.n_layer},
                      {"n_head", made.n_head, c.n_head}};
  for (const Dim& d : dims) {
    if (d.made != d.is) {
      throw Error(std::string(what) + " were made for a model with " + d.name + " " +
                  std::to_string(d.made) + " but this model has " + d.name + " " +
                  std::to_string(d.is) + "; make them from this model's config");
    }
  }
}

void validate_batch(const GptConfig& c, const Activations& acts,
                    std::span<const std::int64_t> inputs, std::span<const std::int64_t> targets,
                    std::int64_t T) {
  check_buffers_fit(c, acts.config, "the activations");
  if (T < 1 || T > c.embedding.max_seq_len) {
    throw Error("sequence length " + std::to_string(T) + " exceeds max_seq_len " +
                std::to_string(c.embedding.max_seq_len) +
                " (the position table's rows); use windows of at most " +
                std::to_string(c.embedding.max_seq_len) +
                " tokens or train a model with a longer --max-seq-len");
  }
  if (T > acts.seq_len) {
    throw Error("sequence length " + std::to_string(T) + " exceeds the " +
                std::to_string(acts.seq_len) + " the activations were sized for");
  }
  const std::size_t n = sz(acts.batch * T);
  if (inputs.size() != n || targets.size() != n) {
    throw Error("inputs hold " + std::to_string(inputs.size()) + " and targets " +
                std::to_string(targets.size()) + " ids but batch " + std::to_string(acts.batch) +
                " x seq_len " + std::to_string(T) + " needs " + std::to_string(n) + " each");
  }
  for (auto ids : {inputs, targets}) {
    for (std::size_t i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= c.embedding.vocab_size) {
        throw Error("token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                    " lies outside [0, " + std::to_string(c.embedding.vocab_size) + ")");
      }
    }
  }
}

double gpt_forward(const Gpt& model, Activations& a, std::span<const std::int64_t> inputs,
                   std::span<const std::int64_t> targets, std::int64_t T, bool train,
                   std::uint64_t step, const TransposedWeights* transposed) {
  const GptConfig& c = model.config;
  validate_batch(c, a, inputs, targets, T);
  if (transposed) check_buffers_fit(c, transposed->config, "the transposed weights");
  check_precision(transposed, a);
  const std::int64_t B = a.batch, C = c.embedding.embed_dim, N = B * T, H = c.n_head,
                     V = c.embedding.vocab_size;
  const auto nc = sz(N * C);
  const DropoutSpec dropout{train ? c.embedding.dropout : 0.0, c.embedding.seed, step};
  a.last_dropout = dropout;
  a.last_seq_len = T;
  const ParamViews& p = model.p;
  // The position ids of a (B, T) batch are its first B*T entries only when T
  // equals the sized length; rebuild them for shorter T (no allocation).
  std::span<std::int64_t> pos(a.positions.data(), sz(N));
  positions_contiguous(pos, B, T, 0);
  const EmbeddingShape shape{B, T, c.embedding.vocab_size, c.embedding.max_seq_len, C};
  embedding_forward(a.encoded.first(nc), inputs, pos, p.wte, p.wpe, shape, dropout,
                    std::span(a.embedding_mask).first(dropout_mask_words(shape)));
  std::span<const float> residual = a.encoded.first(nc);
  // bf16 products: LayerNorm and GELU write their outputs rounded, straight
  // into the copies the products read (and the backward keeps); the fp32
  // outputs are not written.
  const bool bf16 = bf16_products(transposed);
  const auto rounded = [&](std::span<std::uint16_t> copy) {
    return bf16 ? copy : std::span<std::uint16_t>();
  };
  const auto ready = [](Bf16Operands operands) {
    operands.input_ready = operands.enabled();
    return operands;
  };
  for (std::int64_t l = 0; l < c.n_layer; ++l) {
    const BlockViews& w = p.h[sz(l)];
    const TransposedWeights::Block wt =
        transposed ? transposed->h[sz(l)] : TransposedWeights::Block{};
    Activations::Layer& L = a.layers[sz(l)];
    layernorm_forward(L.ln_1, L.ln_1_mean, L.ln_1_rstd, residual, w.ln_1_w, w.ln_1_b, N, C,
                      rounded(L.ln_1_bf16));
    matmul_forward(L.qkv, L.ln_1, w.c_attn_w, w.c_attn_b, N, C, 3 * C,
                   ready(bf16_operands(model, transposed, a, w.c_attn_w, wt.c_attn_w, L.ln_1_bf16)));
    attention_forward(L.atty, L.att, L.qkv, B, T, C, H, rounded(L.attention_bf16));
    matmul_forward(L.attproj, L.atty, w.attn_proj_w, w.attn_proj_b, N, C, C,
                   bf16_operands(model, transposed, a, w.attn_proj_w, wt.attn_proj_w, L.atty_bf16));
    dropout_forward(L.attproj.first(nc), L.attproj.first(nc), dropout,
                    static_cast<std::uint64_t>(l * kSitesPerLayer));
    residual_forward(L.residual2.first(nc), residual, L.attproj.first(nc));
    layernorm_forward(L.ln_2, L.ln_2_mean, L.ln_2_rstd, L.residual2, w.ln_2_w, w.ln_2_b, N, C,
                      rounded(L.ln_2_bf16));
    matmul_gelu_forward(L.fch_gelu, L.fch_dgelu, L.ln_2, w.c_fc_w, w.c_fc_b, N, C, 4 * C,
                        ready(bf16_operands(model, transposed, a, w.c_fc_w, wt.c_fc_w, L.ln_2_bf16)),
                        rounded(L.fch_gelu_bf16));
    matmul_forward(L.mlpproj, L.fch_gelu, w.mlp_proj_w, w.mlp_proj_b, N, 4 * C, C,
                   ready(bf16_operands(model, transposed, a, w.mlp_proj_w, wt.mlp_proj_w,
                                       L.fch_gelu_bf16)));
    dropout_forward(L.mlpproj.first(nc), L.mlpproj.first(nc), dropout,
                    static_cast<std::uint64_t>(l * kSitesPerLayer + 1));
    residual_forward(L.residual3.first(nc), L.residual2.first(nc), L.mlpproj.first(nc));
    residual = L.residual3.first(nc);
  }
  layernorm_forward(a.ln_f, a.ln_f_mean, a.ln_f_rstd, residual, p.ln_f_w, p.ln_f_b, N, C,
                    rounded(a.ln_f_bf16));
  const std::span<const float> wte_t = transposed ? transposed->wte : std::span<const float>();
  matmul_tied_forward(a.logits, a.ln_f, p.wte, N, C, V, wte_t,
                      ready(bf16_operands(model, transposed, a, p.wte, wte_t, a.ln_f_bf16)));
  crossentropy_forward(a.losses, a.probs, a.logits, targets, N, V);
  return gpt_loss_sum(a, N) / static_cast<double>(N);
}

double gpt_loss_sum(const Activations& a, std::int64_t tokens) {
  if (tokens < 0 || sz(tokens) > a.losses.size()) {
    throw Error("loss sum over " + std::to_string(tokens) + " tokens: the activations hold " +
                std::to_string(a.losses.size()));
  }
  double sum = 0.0;  // fixed order, any thread count
  for (std::int64_t i = 0; i < tokens; ++i) sum += a.losses[sz(i)];
  return sum;
}

void gpt_zero_grad(Gpt& model) { zero_grad(model.grads); }

void gpt_backward(Gpt& model, Activations& a, std::span<const std::int64_t> inputs,
                  std::span<const std::int64_t> targets, std::int64_t loss_count) {
  gpt_backward(model, model.g, a, inputs, targets, loss_count);
}

void gpt_backward(const Gpt& model, ParamViews& g, Activations& a,
                  std::span<const std::int64_t> inputs, std::span<const std::int64_t> targets,
                  std::int64_t loss_count, GradMode param_mode,
                  const TransposedWeights* transposed) {
  const GptConfig& c = model.config;
  const std::int64_t T = a.last_seq_len;
  validate_batch(c, a, inputs, targets, T);
  if (transposed) check_buffers_fit(c, transposed->config, "the transposed weights");
  check_precision(transposed, a);
  const std::int64_t B = a.batch, C = c.embedding.embed_dim, N = B * T, H = c.n_head,
                     V = c.embedding.vocab_size;
  const auto nc = sz(N * C);
  const DropoutSpec& dropout = a.last_dropout;
  const ParamViews& p = model.p;
  // Every activation gradient is written fresh by the op that makes it
  // (GradMode::write), so none is cleared first; the residual stream's is
  // written by the final LayerNorm's backward and added to by each block's.
  constexpr GradMode write = GradMode::write;

  if (loss_count < 0) throw Error("loss_count = " + std::to_string(loss_count) + " must be >= 0");
  const std::int64_t count = loss_count == 0 ? N : loss_count;
  std::fill(a.d_losses.begin(), a.d_losses.begin() + N, 1.0f / static_cast<float>(count));
  // bf16 products: the loss's gradient is written rounded, straight into the
  // tied layer's copy of it (d_logits is not written).
  Bf16Operands tied = bf16_operands(model, transposed, a, p.wte,
                                    transposed ? transposed->wte : std::span<const float>(),
                                    a.ln_f_bf16);
  tied.dout_ready = tied.enabled();
  crossentropy_backward(a.d_logits, a.d_losses, a.probs, targets, N, V, write, bf16_dout(tied));
  // The tied output layer writes or adds the token table's gradient first; the
  // embedding's backward adds to it last.
  matmul_tied_backward(a.d_ln, g.wte, a.d_logits, a.ln_f, p.wte, N, C, V, write, param_mode, tied);
  const std::span<const float> last =
      c.n_layer > 0 ? a.layers.back().residual3.first(nc) : a.encoded.first(nc);
  layernorm_backward(a.d_residual, g.ln_f_w, g.ln_f_b, a.d_ln, last, p.ln_f_w, a.ln_f_mean,
                     a.ln_f_rstd, N, C, write, param_mode);
  // A residual branch's gradient is the stream's through its dropout; without
  // dropout it is the stream's gradient itself, read in place.
  const auto branch_grad = [&](std::span<float> scratch,
                               std::uint64_t site) -> std::span<const float> {
    if (dropout.probability == 0.0) return a.d_residual.first(nc);
    dropout_backward(scratch.first(nc), a.d_residual.first(nc), dropout, site, write);
    return scratch.first(nc);
  };
  for (std::int64_t l = c.n_layer - 1; l >= 0; --l) {
    const BlockViews& w = p.h[sz(l)];
    BlockViews& dw = g.h[sz(l)];
    const TransposedWeights::Block wt =
        transposed ? transposed->h[sz(l)] : TransposedWeights::Block{};
    const Activations::Layer& L = a.layers[sz(l)];
    const std::span<const float> layer_in =
        l == 0 ? a.encoded.first(nc) : a.layers[sz(l - 1)].residual3.first(nc);
    // residual3 = residual2 + dropout(mlp_proj(gelu(fc(ln_2(residual2)))))
    const std::span<const float> d_mlpproj =
        branch_grad(a.d_mlpproj, static_cast<std::uint64_t>(l * kSitesPerLayer + 1));
    matmul_gelu_backward(a.d_fch, dw.mlp_proj_w, dw.mlp_proj_b, d_mlpproj, L.fch_gelu, w.mlp_proj_w,
                         L.fch_dgelu, N, 4 * C, C, param_mode, wt.mlp_proj_w,
                         bf16_operands(model, transposed, a, w.mlp_proj_w, wt.mlp_proj_w,
                                       L.fch_gelu_bf16));
    matmul_backward(a.d_ln, dw.c_fc_w, dw.c_fc_b, a.d_fch, L.ln_2, w.c_fc_w, N, C, 4 * C, write,
                    param_mode, wt.c_fc_w,
                    bf16_operands(model, transposed, a, w.c_fc_w, wt.c_fc_w, L.ln_2_bf16));
    layernorm_backward(a.d_residual, dw.ln_2_w, dw.ln_2_b, a.d_ln, L.residual2, w.ln_2_w,
                       L.ln_2_mean, L.ln_2_rstd, N, C, GradMode::accumulate, param_mode);
    // residual2 = layer_in + dropout(attn_proj(attention(c_attn(ln_1(layer_in)))))
    const std::span<const float> d_attproj =
        branch_grad(a.d_attproj, static_cast<std::uint64_t>(l * kSitesPerLayer));
    matmul_backward(a.d_atty, dw.attn_proj_w, dw.attn_proj_b, d_attproj, L.atty, w.attn_proj_w, N,
                    C, C, write, param_mode, wt.attn_proj_w,
                    bf16_operands(model, transposed, a, w.attn_proj_w, wt.attn_proj_w,
                                  L.atty_bf16));
    attention_backward(a.d_qkv, a.d_att, a.d_atty, L.qkv, L.att, B, T, C, H, write,
                       bf16_products(transposed) ? L.attention_bf16
                                                 : std::span<std::uint16_t>());
    matmul_backward(a.d_ln, dw.c_attn_w, dw.c_attn_b, a.d_qkv, L.ln_1, w.c_attn_w, N, C, 3 * C,
                    write, param_mode, wt.c_attn_w,
                    bf16_operands(model, transposed, a, w.c_attn_w, wt.c_attn_w, L.ln_1_bf16));
    layernorm_backward(a.d_residual, dw.ln_1_w, dw.ln_1_b, a.d_ln, layer_in, w.ln_1_w,
                       L.ln_1_mean, L.ln_1_rstd, N, C, GradMode::accumulate, param_mode);
  }
  // The core layer's backward, dense token gradient shared with the tied output
  // layer (added to what it wrote); an empty position span freezes the table.
  // A written gradient clears the position table's first (it is small), so
  // that one call adds into both, a frozen one included.
  if (param_mode == GradMode::write) std::fill(g.wpe.begin(), g.wpe.end(), 0.0f);
  const std::span<const std::int64_t> pos(a.positions.data(), sz(N));
  const EmbeddingShape shape{B, T, c.embedding.vocab_size, c.embedding.max_seq_len, C};
  embedding_backward(g.wte, model.freeze_positions ? std::span<float>() : g.wpe,
                     a.d_residual.first(nc), inputs, pos, shape, dropout, GradMode::accumulate,
                     std::span<const std::uint64_t>(a.embedding_mask).first(dropout_mask_words(shape)));
}

}  // namespace posembed::model
