#include "posembed/tools/bench/kernel_suite.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>

#include "posembed/core/aligned.h"
#include "posembed/core/error.h"
#include "posembed/core/half.h"
#include "posembed/core/layer.h"
#include "posembed/core/optim.h"
#include "posembed/core/parallel.h"
#include "posembed/core/position_ids.h"
#include "posembed/core/reference.h"
#include "posembed/tools/bench/torch_runner.h"
#include "posembed/tools/machine.h"

namespace posembed::tools::bench {
namespace {

template <class To, class From, class Allocator>
std::vector<To> cast(const std::vector<From, Allocator>& v) {
  return std::vector<To>(v.begin(), v.end());
}

// The bench's arrays start on a cache line (core/aligned.h), as PyTorch's
// tensors do.
using Floats = LineFloats;

void check(bool ok, const std::string& what) {
  if (!ok) throw Error("bench validation failed: " + what);
}

// One kernel's timing in one round.
struct KernelResult {
  std::string name, what;
  Timing timing;
  double bytes = 0;
  std::string torch_peer;
};

// Everything one shape needs, allocated once, before any timing.
struct Workload {
  EmbeddingShape s;
  std::size_t n = 0, d = 0;
  std::vector<std::int64_t> tokens, positions;     // (B, T)
  Floats token_table, position_table;  // (V, d), (max_seq_len, d)
  Floats out, grad_out;                // (B, T, d)
  Floats grad_tok, grad_pos;           // (V, d), (max_seq_len, d)
  Floats m_tok, v_tok, m_pos, v_pos;   // AdamW moments
  SparseRowGrad sparse;
  // The training forward's dropout mask, kept for the backwards as PyTorch's
  // dropout keeps its own.
  std::vector<std::uint64_t> mask_bits;
  std::size_t distinct_tokens = 0, distinct_positions = 0;

  explicit Workload(const EmbeddingShape& shape) : s(shape) {
    n = static_cast<std::size_t>(s.batch * s.seq_len);
    d = static_cast<std::size_t>(s.embed_dim);
    std::mt19937_64 engine(20240601);
    tokens.resize(n);
    for (auto& t : tokens)
      t = static_cast<std::int64_t>(engine() % static_cast<std::uint64_t>(s.vocab_size));
    positions.resize(n);
    positions_contiguous(positions, s.batch, s.seq_len, 0);
    // Every array as posembed allocates its own (the layer's tables, the
    // trainer's memory): advised as huge pages (assign_zeros_huge), so that a
    // random token row costs no page walk. PyTorch keeps its defaults.
    const auto fill = [&](Floats& v, std::size_t size) {
      assign_zeros_huge(v, size);
      for (auto& x : v)
        x = static_cast<float>(static_cast<double>(engine() >> 11) / 9007199254740992.0 - 0.5);
    };
    const auto V = static_cast<std::size_t>(s.vocab_size),
               P = static_cast<std::size_t>(s.max_seq_len);
    fill(token_table, V * d);
    fill(position_table, P * d);
    fill(grad_out, n * d);
    assign_zeros_huge(out, n * d);
    for (Floats* table : {&grad_tok, &m_tok, &v_tok}) assign_zeros_huge(*table, V * d);
    for (Floats* table : {&grad_pos, &m_pos, &v_pos}) assign_zeros_huge(*table, P * d);
    mask_bits.assign(dropout_mask_words(s), 0);
    distinct_tokens = std::set<std::int64_t>(tokens.begin(), tokens.end()).size();
    distinct_positions = std::set<std::int64_t>(positions.begin(), positions.end()).size();
  }
};

// Forward against core/reference.h in double: two roundings (the sum, the
// dropout scale), and exact zeros where the mask drops.
void validate_forward(Workload& w, const DropoutSpec& dropout) {
  embedding_forward(w.out, w.tokens, w.positions, w.token_table, w.position_table, w.s, dropout,
                    w.mask_bits);
  const std::vector<double> ref =
      reference::embedding_forward<double>(w.tokens, w.positions, cast<double>(w.token_table),
                                           cast<double>(w.position_table), w.s, dropout);
  constexpr double eps = std::numeric_limits<float>::epsilon();
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (std::abs(w.out[i] - ref[i]) > 2 * eps * std::abs(ref[i]) ||
        ((ref[i] == 0) != (w.out[i] == 0))) {
      check(false, "forward p " + std::to_string(dropout.probability) + " element " + std::to_string(i));
    }
  }
}

// Backward: dense (accumulated and written fresh, and given the kept mask) and
// row-sparse agree bit for bit on the touched rows, and both
// tables' gradients match core/reference.h in double within (uses + 1) x eps x
// the sum of |terms| (which is the reference run on |grad_out|).
void validate_backward(Workload& w, const DropoutSpec& dropout) {
  std::fill(w.grad_tok.begin(), w.grad_tok.end(), 0.0f);
  std::fill(w.grad_pos.begin(), w.grad_pos.end(), 0.0f);
  embedding_backward(w.grad_tok, w.grad_pos, w.grad_out, w.tokens, w.positions, w.s, dropout);
  zero_grad(w.sparse);
  std::vector<float> pos2(w.grad_pos.size(), 0.0f);
  embedding_backward(w.sparse, pos2, w.grad_out, w.tokens, w.positions, w.s, dropout);
  check(std::equal(pos2.begin(), pos2.end(), w.grad_pos.begin(), w.grad_pos.end()),
        "position gradient differs between dense and sparse backward");
  // A fresh gradient written over other values: the same bits as zero + accumulate.
  std::vector<float> tok3(w.grad_tok.size(), 1.0f), pos3(w.grad_pos.size(), 1.0f);
  embedding_backward(tok3, pos3, w.grad_out, w.tokens, w.positions, w.s, dropout, GradMode::write);
  check(std::memcmp(tok3.data(), w.grad_tok.data(), tok3.size() * sizeof(float)) == 0 &&
            std::memcmp(pos3.data(), w.grad_pos.data(), pos3.size() * sizeof(float)) == 0,
        "a written fresh gradient differs from zero_grad + accumulate");
  // The mask the training forward kept (validate_forward ran it last) in place of drawing it.
  embedding_backward(tok3, pos3, w.grad_out, w.tokens, w.positions, w.s, dropout, GradMode::write,
                     w.mask_bits);
  check(std::memcmp(tok3.data(), w.grad_tok.data(), tok3.size() * sizeof(float)) == 0 &&
            std::memcmp(pos3.data(), w.grad_pos.data(), pos3.size() * sizeof(float)) == 0,
        "a backward given the kept mask differs from one that draws it");
  check(w.sparse.rows.size() == w.distinct_tokens, "sparse gradient row count");
  std::vector<double> ref_tok(w.grad_tok.size()), abs_tok(w.grad_tok.size()),
      ref_pos(w.grad_pos.size()), abs_pos(w.grad_pos.size()), abs_grad(w.grad_out.size());
  std::transform(w.grad_out.begin(), w.grad_out.end(), abs_grad.begin(),
                 [](float g) { return std::abs(double{g}); });
  reference::embedding_backward<double>(ref_tok, ref_pos, cast<double>(w.grad_out), w.tokens,
                                        w.positions, w.s, dropout);
  reference::embedding_backward<double>(abs_tok, abs_pos, abs_grad, w.tokens, w.positions, w.s,
                                        dropout);
  std::vector<double> uses_tok(static_cast<std::size_t>(w.s.vocab_size)),
      uses_pos(w.grad_pos.size() / w.d);
  for (std::size_t r = 0; r < w.n; ++r) {
    ++uses_tok[static_cast<std::size_t>(w.tokens[r])];
    ++uses_pos[static_cast<std::size_t>(w.positions[r])];
  }
  constexpr double eps = std::numeric_limits<float>::epsilon();
  const auto within = [&](const Floats& got, const std::vector<double>& ref,
                          const std::vector<double>& abs, const std::vector<double>& uses,
                          const char* what) {
    for (std::size_t i = 0; i < ref.size(); ++i) {
      check(std::abs(got[i] - ref[i]) <= (uses[i / w.d] + 1) * eps * abs[i] + 1e-30,
            std::string(what) + " gradient element " + std::to_string(i));
    }
  };
  within(w.grad_tok, ref_tok, abs_tok, uses_tok, "token");
  within(w.grad_pos, ref_pos, abs_pos, uses_pos, "position");
  for (std::size_t k = 0; k < w.sparse.rows.size(); ++k) {
    const float* dense = w.grad_tok.data() + static_cast<std::size_t>(w.sparse.rows[k]) * w.d;
    check(std::memcmp(dense, w.sparse.values.data() + k * w.d, w.d * sizeof(float)) == 0,
          "dense and sparse token rows differ");
  }
}

// AdamW on a copy of the position table against the double-precision update.
void validate_adamw(const Workload& w, const AdamWConfig& c) {
  std::vector<float> p(w.position_table.begin(), w.position_table.end()), m(p.size(), 0.0f),
      v(p.size(), 0.0f);
  const Floats& g = w.grad_pos;
  adamw_step(p, g, m, v, 1, c);
  constexpr double eps = std::numeric_limits<float>::epsilon();
  for (std::size_t i = 0; i < p.size(); ++i) {
    double rp = w.position_table[i], rm = 0, rv = 0;
    reference::adamw_update<double>(rp, g[i], rm, rv, 1, c.lr, c.beta1, c.beta2, c.eps,
                                    c.weight_decay);
    // A few roundings of the step (about lr at step 1) and of |param|.
    check(std::abs(p[i] - rp) <= 20 * eps * (c.lr + std::abs(rp)),
          "AdamW element " + std::to_string(i));
  }
}

// The bf16 layer's arrays (issue 40): the float workload's tables rounded once,
// and the output, grad_out and fresh gradients in bf16. Held in float storage
// advised as huge pages (assign_zeros_huge), as the float arrays are, so that
// both pay the same for a scattered row, and viewed as bf16.
struct HalfWorkload {
  Floats storage[6];
  std::span<bf16> token_table, position_table, out, grad_out, grad_tok, grad_pos;

  explicit HalfWorkload(const Workload& w) {
    const auto view = [&](std::size_t k, std::size_t n) {
      assign_zeros_huge(storage[k], (n + 1) / 2);
      return std::span<bf16>(reinterpret_cast<bf16*>(storage[k].data()), n);
    };
    token_table = view(0, w.token_table.size());
    position_table = view(1, w.position_table.size());
    out = view(2, w.out.size());
    grad_out = view(3, w.grad_out.size());
    grad_tok = view(4, w.grad_tok.size());
    grad_pos = view(5, w.grad_pos.size());
    const auto round = [](std::span<bf16> to, const Floats& from) {
      std::transform(from.begin(), from.end(), to.begin(), to_bf16);
    };
    round(token_table, w.token_table);
    round(position_table, w.position_table);
    round(grad_out, w.grad_out);
  }
};

// bf16 tables against the float layer: the forward equal to the float forward
// of the widened tables rounded once; the fresh gradients equal to the float
// gradients of the widened grad_out rounded once.
void validate_half(Workload& w, HalfWorkload& h, const DropoutSpec& dropout) {
  const auto widen_all = [](std::span<const bf16> from) {
    std::vector<float> to(from.size());
    std::transform(from.begin(), from.end(), to.begin(), [](bf16 x) { return to_float(x); });
    return to;
  };
  const auto equal_rounded = [](std::span<const bf16> got, std::span<const float> want) {
    for (std::size_t i = 0; i < want.size(); ++i) {
      if (got[i].bits != to_bf16(want[i]).bits) return false;
    }
    return true;
  };
  const std::vector<float> tok = widen_all(h.token_table), pos = widen_all(h.position_table),
                           grad = widen_all(h.grad_out);
  std::vector<float> out(w.out.size()), gt(w.grad_tok.size()), gp(w.grad_pos.size());
  embedding_forward(out, w.tokens, w.positions, tok, pos, w.s, dropout);
  embedding_forward(std::span(h.out), w.tokens, w.positions, std::span<const bf16>(h.token_table),
                    std::span<const bf16>(h.position_table), w.s, dropout, w.mask_bits);
  check(equal_rounded(h.out, out), "bf16 forward differs from the float forward rounded once");
  embedding_backward(gt, gp, grad, w.tokens, w.positions, w.s, dropout, GradMode::write);
  embedding_backward(std::span(h.grad_tok), std::span(h.grad_pos), std::span<const bf16>(h.grad_out), w.tokens,
                     w.positions, w.s, dropout, GradMode::write, w.mask_bits);
  check(equal_rounded(h.grad_tok, gt) && equal_rounded(h.grad_pos, gp),
        "bf16 gradients differ from the float gradients rounded once");
}

// The bf16 layer's kernels (forward_eval_bf16, forward_train_bf16,
// fwd_bwd_dense_bf16), each against PyTorch's bf16 tables as its peer.
std::vector<KernelResult> time_half_kernels(Workload& w, int reps, bool validate,
                                            const std::function<void()>& before_each) {
  HalfWorkload h(w);
  const DropoutSpec eval{}, train{0.1, 1234, 1};
  if (validate) validate_half(w, h, train);
  const double half = 2, id = sizeof(std::int64_t);
  const double n = static_cast<double>(w.n), d = static_cast<double>(w.d);
  const double V = static_cast<double>(w.s.vocab_size), P = static_cast<double>(w.s.max_seq_len);
  const double Ut = static_cast<double>(w.distinct_tokens), Up = static_cast<double>(w.distinct_positions);
  const double fwd_bytes = n * d * half + (Ut + Up) * d * half + 2 * n * id;
  const double bwd_write_bytes = n * d * half + (V + P) * d * half + 2 * n * id;
  const double mask_bytes = n * d / 8;
  const auto forward = [&](const DropoutSpec& dropout) {
    embedding_forward(std::span(h.out), w.tokens, w.positions, std::span<const bf16>(h.token_table),
                      std::span<const bf16>(h.position_table), w.s, dropout, w.mask_bits);
  };
  std::vector<KernelResult> results;
  results.push_back({"forward_eval_bf16", "forward, eval, bf16 tables",
                     time_it(reps, [&] { forward(eval); }, before_each), fwd_bytes, "forward_eval_bf16"});
  results.push_back({"forward_train_bf16", "forward, training, dropout 0.1, bf16 tables",
                     time_it(reps, [&] { forward(train); }, before_each), fwd_bytes + mask_bytes,
                     "forward_train_bf16"});
  results.push_back({"fwd_bwd_dense_bf16", "train fwd + bwd writing fresh dense bf16 grads",
                     time_it(
                         reps,
                         [&] {
                           forward(train);
                           embedding_backward(std::span(h.grad_tok), std::span(h.grad_pos),
                                              std::span<const bf16>(h.grad_out), w.tokens, w.positions, w.s,
                                              train, GradMode::write, w.mask_bits);
                         },
                         before_each),
                     fwd_bytes + bwd_write_bytes + 2 * mask_bytes, "fwd_bwd_dense_bf16"});
  return results;
}

// before_each: runs untimed before every run of every kernel (--cold), or empty.
std::vector<KernelResult> time_kernels(Workload& w, int reps, bool validate,
                                       const std::function<void()>& before_each) {
  const double f = sizeof(float), id = sizeof(std::int64_t);
  const double n = static_cast<double>(w.n), d = static_cast<double>(w.d);
  const double V = static_cast<double>(w.s.vocab_size), P = static_cast<double>(w.s.max_seq_len);
  const double Ut = static_cast<double>(w.distinct_tokens),
               Up = static_cast<double>(w.distinct_positions);
  const DropoutSpec eval{}, train{0.1, 1234, 1};
  const AdamWConfig adamw{};

  if (validate) {
    validate_forward(w, eval);
    validate_forward(w, train);
    validate_backward(w, train);
    validate_adamw(w, adamw);
  }

  // Least traffic: every output written once, every distinct table row read
  // once, the ids read; gradients read grad_out once and read + write each
  // touched gradient row once (a fresh sparse row is only written).
  const double fwd_bytes = n * d * f + (Ut + Up) * d * f + 2 * n * id;
  const double bwd_dense_bytes = n * d * f + 2 * (Ut + Up) * d * f + 2 * n * id;
  const double bwd_sparse_bytes = n * d * f + (Ut + 2 * Up) * d * f + 2 * n * id;
  // The same with a fresh position gradient: all its rows written, none read.
  const double bwd_sparse_write_bytes = n * d * f + (Ut + P) * d * f + 2 * n * id;
  const double zero_dense_bytes = V * d * f;
  // A fresh dense gradient: both tables written once, grad_out and the ids read.
  const double bwd_write_bytes = n * d * f + (V + P) * d * f + 2 * n * id;
  const double adamw_bytes = 7 * (V + P) * d * f;  // read p, g, m, v; write p, m, v
  // The training forward writes its mask's bits and the backwards read them.
  const double mask_bytes = n * d / 8;

  std::vector<KernelResult> results;
  // A training forward keeps its mask (a no-op in eval) and the backwards read
  // it, as PyTorch's dropout and autograd do.
  const auto forward = [&](const DropoutSpec& dropout) {
    embedding_forward(w.out, w.tokens, w.positions, w.token_table, w.position_table, w.s, dropout,
                      w.mask_bits);
  };
  const auto backward_dense = [&] {
    embedding_backward(w.grad_tok, w.grad_pos, w.grad_out, w.tokens, w.positions, w.s, train,
                       GradMode::accumulate, w.mask_bits);
  };
  const auto backward_write = [&] {
    embedding_backward(w.grad_tok, w.grad_pos, w.grad_out, w.tokens, w.positions, w.s, train,
                       GradMode::write, w.mask_bits);
  };
  // The position gradient added to (backward_sparse), or written fresh as after
  // PyTorch's zero_grad(set_to_none=True) (fwd_bwd_sparse).
  const auto backward_sparse = [&](GradMode position_mode) {
    zero_grad(w.sparse);
    embedding_backward(w.sparse, w.grad_pos, w.grad_out, w.tokens, w.positions, w.s, train,
                       position_mode, w.mask_bits);
  };
  results.push_back({"forward_eval", "forward, eval (no dropout)",
                     time_it(
                         reps, [&] { forward(eval); }, before_each),
                     fwd_bytes, "forward_eval"});
  results.push_back({"forward_train", "forward, training, dropout 0.1",
                     time_it(
                         reps, [&] { forward(train); }, before_each),
                     fwd_bytes + mask_bytes, "forward_train"});
  results.push_back({"backward_dense", "backward, dense token grad (+=), p 0.1",
                     time_it(reps, backward_dense, before_each), bwd_dense_bytes + mask_bytes,
                     "backward_dense"});
  results.push_back({"backward_write", "backward, fresh dense grads written, p 0.1",
                     time_it(reps, backward_write, before_each), bwd_write_bytes + mask_bytes,
                     "backward_dense"});
  results.push_back({"backward_sparse", "backward, row-sparse token grad, p 0.1",
                     time_it(
                         reps, [&] { backward_sparse(GradMode::accumulate); }, before_each),
                     bwd_sparse_bytes + mask_bytes, "backward_sparse"});
  results.push_back({"zero_grad_dense", "zero_grad of the dense (V, d) token grad",
                     time_it(
                         reps, [&] { zero_grad(w.grad_tok); }, before_each),
                     zero_dense_bytes, "zero_grad_dense"});
  results.push_back({"fwd_bwd_sparse", "train fwd + bwd, row-sparse, fresh position grad",
                     time_it(
                         reps,
                         [&] {
                           forward(train);
                           backward_sparse(GradMode::write);
                         },
                         before_each),
                     fwd_bytes + bwd_sparse_write_bytes + 2 * mask_bytes, "fwd_bwd_sparse"});
  results.push_back({"fwd_bwd_dense", "train fwd + bwd writing fresh dense grads",
                     time_it(
                         reps,
                         [&] {
                           forward(train);
                           backward_write();
                         },
                         before_each),
                     fwd_bytes + bwd_write_bytes + 2 * mask_bytes, "fwd_bwd_dense"});
  std::int64_t step = 0;
  results.push_back({"adamw", "AdamW step, both tables, dense",
                     time_it(
                         std::max(3, reps / 3),
                         [&] {
                           ++step;
                           adamw_step(w.token_table, w.grad_tok, w.m_tok, w.v_tok, step, adamw);
                           adamw_step(w.position_table, w.grad_pos, w.m_pos, w.v_pos, step, adamw);
                         },
                         before_each),
                     adamw_bytes, "adamw"});
  return results;
}

}  // namespace

const std::vector<BenchShape>& named_shapes() {
  // {B, T, V, max_seq_len, d}: the shapes users train at, the seed's embed_dim
  // 256-4096 and max_seq_len 512-8192 among them.
  static const std::vector<BenchShape> shapes = {
      {"gpt2", {8, 1024, 50257, 1024, 768}},        // GPT-2 small, its training batch
      {"small", {32, 128, 256, 128, 128}},          // a toy: the thread and call overheads
      {"gpt2-xl", {4, 1024, 50257, 1024, 1600}},    // GPT-2 XL
      {"bert-128", {64, 128, 30522, 512, 768}},     // BERT-base, pre-training phase 1
      {"bert-512", {16, 512, 30522, 512, 768}},     // BERT-base, phase 2
      {"wide-4096", {2, 2048, 32000, 2048, 4096}},  // a 7B-like width (LLaMA-7B's table)
      {"long-8192", {1, 8192, 50257, 8192, 1024}},  // a long context
      {"d256", {32, 512, 32000, 512, 256}},         // a small model
  };
  return shapes;
}

std::string shape_names() {
  std::string names;
  for (const BenchShape& s : named_shapes()) names += (names.empty() ? "" : ", ") + s.name;
  return names;
}

namespace {

// One field of V,T,d,B: a whole number from 1 to `limit`.
std::int64_t shape_field(const std::string& text, const std::string& field, const char* what,
                         std::int64_t limit) {
  const bool digits =
      !field.empty() && field.size() <= 18 &&
      std::all_of(field.begin(), field.end(), [](char c) { return c >= '0' && c <= '9'; });
  const std::int64_t value = digits ? std::stoll(field) : 0;
  if (!digits || value < 1 || value > limit) {
    throw Error("--shape " + text + ": " + what + " '" + field +
                "' must be a whole number from 1 to " + std::to_string(limit) +
                "; give V,T,d,B (vocab_size, seq_len, embed_dim, batch), "
                "e.g. 50257,1024,768,8, or a name: " +
                shape_names());
  }
  return value;
}

}  // namespace

BenchShape parse_bench_shape(const std::string& text) {
  for (const BenchShape& s : named_shapes()) {
    if (s.name == text) return s;
  }
  std::vector<std::string> fields(1);
  for (const char c : text) {
    if (c == ',') {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  if (fields.size() != 4) {
    throw Error("--shape " + text + " is neither a shape's name (" + shape_names() +
                ") nor V,T,d,B: four whole numbers (vocab_size, seq_len, embed_dim, batch) "
                "separated by commas, e.g. 50257,1024,768,8");
  }
  // Each table and each (B, T, d) array within 2^34 floats (64 GiB): past
  // what a benchmark's machine holds, short of overflow in any product.
  constexpr std::int64_t kMaxFloats = std::int64_t{1} << 34;
  const std::int64_t vocab = shape_field(text, fields[0], "V (vocab_size)", kMaxFloats);
  const std::int64_t seq = shape_field(text, fields[1], "T (seq_len)", kMaxFloats);
  const std::int64_t dim = shape_field(text, fields[2], "d (embed_dim)", kMaxFloats);
  const std::int64_t batch = shape_field(text, fields[3], "B (batch)", kMaxFloats);
  // T x d within the limit first, so that B x T x d is computed without overflow.
  const auto within = [&](std::int64_t rows, std::int64_t row_floats, const char* what) {
    if (rows > kMaxFloats / row_floats) {
      throw Error("--shape " + text + ": " + what + " holds " + std::to_string(rows) + " x " +
                  std::to_string(row_floats) +
                  " floats, more than the 2^34 (64 GiB) a bench "
                  "allows; choose a smaller shape");
    }
  };
  within(vocab, dim, "the token table (V x d)");
  within(seq, dim, "the position table (T x d)");
  within(batch, seq * dim, "the output (B x T x d)");
  return {text, {batch, seq, vocab, seq, dim}};
}

std::vector<BenchShape> bench_shapes(bool quick, const std::vector<std::string>& only) {
  if (quick) return {{"tiny", {2, 16, 50, 16, 24}}, {"odd", {3, 7, 13, 9, 17}}};
  if (only.empty()) return {named_shapes()[0], named_shapes()[1]};
  std::vector<BenchShape> chosen;
  for (const std::string& text : only) {
    if (text == "all") {
      chosen.insert(chosen.end(), named_shapes().begin(), named_shapes().end());
    } else {
      chosen.push_back(parse_bench_shape(text));
    }
  }
  return chosen;
}

double KernelSeries::min_ms() const {
  return *std::min_element(mins.begin(), mins.end());
}

double KernelSeries::spread() const {
  return *std::max_element(medians.begin(), medians.end()) /
         *std::min_element(medians.begin(), medians.end());
}

double KernelSeries::torch_median_ms() const {
  double best = INFINITY;
  for (const std::vector<double>& column : torch_medians) {
    if (!column.empty()) best = std::min(best, median(column));
  }
  return std::isfinite(best) ? best : NAN;
}

SuiteReport run_kernel_suite(const SuiteOptions& o) {
  set_num_threads(o.threads);
  const std::vector<BenchShape> shapes = bench_shapes(o.quick, o.only);
  // Three arrays of 128 MiB: far past the last-level cache. Measured again at
  // the start of every round and its best run kept: a machine's bandwidth can
  // move by 2x within minutes, and a probe of a run's first seconds alone can
  // land in a slow moment and put kernels past it.
  const auto measure_probe = [&] {
    return bandwidth_probe(o.quick ? (1u << 20) : (32u << 20), o.quick ? 2 : 7);
  };
  SuiteReport report;
  report.probe = measure_probe();
  // Cold: before each timed run, a read of twice the last-level cache. Back to
  // back, part of a run's data stays in the cache from the run before (at the
  // GPT-2 shape, part of the 23 MB of token rows in a 32 MiB L3), and a forward
  // then beats the streaming probe. --quick checks the code path only: a small
  // buffer.
  report.llc_bytes = last_level_cache_bytes();
  std::unique_ptr<CacheEvictor> evict;
  if (o.cold)
    evict = std::make_unique<CacheEvictor>(o.quick ? std::size_t{4} << 20
                                                   : eviction_bytes(report.llc_bytes));
  report.evict_bytes = evict ? evict->bytes() : 0;
  const std::function<void()> before_each =
      evict ? std::function<void()>([&] { (*evict)(); }) : std::function<void()>();
  const std::size_t columns = o.pythons.size();
  for (const BenchShape& shape : shapes) report.shapes.push_back({shape, 0, {}});
  for (int round = 0; round < o.rounds; ++round) {
    if (round > 0) report.probe.keep_best(measure_probe());
    for (ShapeReport& sr : report.shapes) {
      const EmbeddingShape& s = sr.shape.dims;
      // Small shapes get more runs (their times are short and noisy); huge ones
      // (an array of 256 MiB or more) a third, to keep a sweep's time bounded.
      const std::int64_t floats = std::max(s.batch * s.seq_len, s.vocab_size) * s.embed_dim;
      const int reps = o.quick               ? 2
                       : floats >= (1 << 26) ? std::max(3, o.reps / 3)
                       : floats >= (1 << 20) ? o.reps
                                             : 3 * o.reps;
      // PyTorch first, then ours, shape by shape: both see the same machine load.
      std::vector<TorchRun> torch(columns);
      for (std::size_t c = 0; c < columns; ++c) {
        const TorchBenchCall call{o.pythons[c], o.torch_script,  o.threads,
                                  reps,         o.torch_compile, report.evict_bytes};
        torch[c] = run_torch_bench(call, sr.shape.name, s);
        if (report.torch.size() == c) {
          report.torch.push_back({o.pythons[c], torch[c].version, torch[c].threads,
                                  torch[c].compile, torch[c].evict_bytes});
        }
      }
      Workload w(s);
      sr.distinct_tokens = w.distinct_tokens;
      std::vector<KernelResult> results = time_kernels(w, reps, round == 0, before_each);
      const std::vector<KernelResult> half = time_half_kernels(w, reps, round == 0, before_each);
      results.insert(results.end(), half.begin(), half.end());
      if (round == 0) {
        for (const KernelResult& r : results) {
          sr.kernels.push_back({r.name,
                                r.what,
                                r.bytes,
                                r.torch_peer,
                                {},
                                {},
                                std::vector<std::vector<double>>(columns),
                                std::vector<std::vector<double>>(columns),
                                std::vector<std::vector<std::string>>(columns)});
        }
      }
      for (std::size_t k = 0; k < results.size(); ++k) {
        KernelSeries& row = sr.kernels[k];
        row.medians.push_back(results[k].timing.median_ms);
        row.mins.push_back(results[k].timing.min_ms);
        for (std::size_t c = 0; c < columns; ++c) {
          const auto peer = torch[c].kernels.find(row.torch_peer);
          if (peer == torch[c].kernels.end()) continue;
          row.torch_medians[c].push_back(peer->second.median_ms);
          row.torch_mins[c].push_back(peer->second.min_ms);
          row.torch_variants[c].push_back(peer->second.variant);
        }
      }
    }
  }
  return report;
}

// Forward plus backward is held against PyTorch's default nn.Embedding (a fresh
// dense gradient), for both of our gradients; the row-sparse one also against
// PyTorch's sparse=True.
std::vector<Ratio> summary_ratios(const ShapeReport& shape, const Probe& probe) {
  const auto kernel = [&](const std::string& name) -> const KernelSeries& {
    for (const KernelSeries& k : shape.kernels) {
      if (k.name == name) return k;
    }
    throw Error("bench: no kernel " + name);
  };
  const auto ours = [&](const std::string& name) { return kernel(name).median_ms(); };
  const auto torch = [&](const std::string& name) { return kernel(name).torch_median_ms(); };
  const auto gbps = [&](const std::string& name) { return kernel(name).bytes / ours(name) / 1e6; };
  // A kernel's time with its least traffic moved at `rate` GB/s.
  const auto at_probe_ms = [&](const std::string& name, double rate) {
    return kernel(name).bytes / (rate * 1e6);
  };
  const std::vector<Ratio> all = {
      {"eval forward, PyTorch / ours", torch("forward_eval") / ours("forward_eval")},
      {"eval forward, fraction of the probe", gbps("forward_eval") / probe.gbps()},
      {"training forward (p 0.1), PyTorch / ours", torch("forward_train") / ours("forward_train")},
      {"fwd+bwd: PyTorch default (dense) / ours, row-sparse",
       torch("fwd_bwd_dense") / ours("fwd_bwd_sparse")},
      {"fwd+bwd: PyTorch default (dense) / ours, dense",
       torch("fwd_bwd_dense") / ours("fwd_bwd_dense")},
      // What the machine's memory allows: PyTorch's time over that of our
      // traffic at the probe's speed.
      {"fwd+bwd, ceiling: PyTorch default / row-sparse at probe",
       torch("fwd_bwd_dense") / at_probe_ms("fwd_bwd_sparse", probe.gbps())},
      {"fwd+bwd, ceiling: PyTorch default / dense at probe",
       torch("fwd_bwd_dense") / at_probe_ms("fwd_bwd_dense", probe.gbps())},
      {"fwd+bwd: PyTorch sparse=True / ours, row-sparse",
       torch("fwd_bwd_sparse") / ours("fwd_bwd_sparse")},
      {"AdamW, PyTorch / ours", torch("adamw") / ours("adamw")},
      // AdamW's ceiling: PyTorch's time over the update probe's for its traffic.
      {"AdamW, ceiling: PyTorch / the update probe's time",
       torch("adamw") / at_probe_ms("adamw", probe.update_gbps)},
      {"AdamW, fraction of the update probe", gbps("adamw") / probe.update_gbps},
      // bf16 tables: against our float layer, and against PyTorch's bf16 tables.
      {"bf16 eval forward, ours bf16 / ours float32",
       ours("forward_eval_bf16") / ours("forward_eval")},
      {"bf16 training forward, ours bf16 / ours float32",
       ours("forward_train_bf16") / ours("forward_train")},
      {"bf16 fwd+bwd dense, ours bf16 / ours float32",
       ours("fwd_bwd_dense_bf16") / ours("fwd_bwd_dense")},
      {"bf16 eval forward, PyTorch bf16 / ours",
       torch("forward_eval_bf16") / ours("forward_eval_bf16")},
      {"bf16 eval forward, ceiling: PyTorch bf16 / at probe",
       torch("forward_eval_bf16") / at_probe_ms("forward_eval_bf16", probe.gbps())},
      {"bf16 training forward, PyTorch bf16 / ours",
       torch("forward_train_bf16") / ours("forward_train_bf16")},
      {"bf16 fwd+bwd dense, PyTorch bf16 / ours",
       torch("fwd_bwd_dense_bf16") / ours("fwd_bwd_dense_bf16")},
      {"bf16 fwd+bwd dense, ceiling: PyTorch bf16 / at probe",
       torch("fwd_bwd_dense_bf16") / at_probe_ms("fwd_bwd_dense_bf16", probe.gbps())},
  };
  std::vector<Ratio> out;
  for (const Ratio& r : all) {
    if (!std::isnan(r.value)) out.push_back(r);  // NaN: no PyTorch column
  }
  return out;
}

}  // namespace posembed::tools::bench
