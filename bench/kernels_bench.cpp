// Google Benchmark programs for the core kernels, for profiling one kernel at a
// time (--benchmark_filter) with bytes/s reported. `posembed bench` is the
// side-by-side report against PyTorch and a bandwidth probe; this is the tool
// for iterating on a kernel.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "posembed/core/embedding.h"
#include "posembed/core/optim.h"

namespace posembed {
namespace {

struct Inputs {
  EmbeddingShape shape;
  std::vector<std::int64_t> tokens, positions;
  std::vector<float> token_table, position_table, out, grad_out;
};

// args: batch, seq_len, embed_dim, vocab_size
Inputs make_inputs(const benchmark::State& state) {
  Inputs in;
  in.shape = {state.range(0), state.range(1), state.range(3), state.range(1), state.range(2)};
  const auto n = static_cast<std::size_t>(in.shape.batch * in.shape.seq_len);
  const auto d = static_cast<std::size_t>(in.shape.embed_dim);
  std::mt19937 engine(1);
  in.tokens.resize(n);
  in.positions.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    in.tokens[i] = static_cast<std::int64_t>(engine() % static_cast<std::uint32_t>(in.shape.vocab_size));
    in.positions[i] = static_cast<std::int64_t>(i % static_cast<std::size_t>(in.shape.seq_len));
  }
  in.token_table.assign(static_cast<std::size_t>(in.shape.vocab_size) * d, 0.01f);
  in.position_table.assign(static_cast<std::size_t>(in.shape.max_seq_len) * d, 0.02f);
  in.out.assign(n * d, 0.0f);
  in.grad_out.assign(n * d, 1.0f);
  return in;
}

// Bytes a kernel must move at least: the output (or output gradient) once.
void set_bytes(benchmark::State& state, const Inputs& in) {
  state.SetBytesProcessed(state.iterations() *
                          static_cast<std::int64_t>(in.out.size() * sizeof(float)));
}

void BM_ForwardEval(benchmark::State& state) {
  Inputs in = make_inputs(state);
  for (auto _ : state) {
    embedding_forward(in.out, in.tokens, in.positions, in.token_table, in.position_table, in.shape, {});
    benchmark::DoNotOptimize(in.out.data());
  }
  set_bytes(state, in);
}

void BM_ForwardTrain(benchmark::State& state) {
  Inputs in = make_inputs(state);
  std::uint64_t step = 0;
  for (auto _ : state) {
    embedding_forward(in.out, in.tokens, in.positions, in.token_table, in.position_table, in.shape,
                      {0.1, 1, step++});
    benchmark::DoNotOptimize(in.out.data());
  }
  set_bytes(state, in);
}

void BM_BackwardDense(benchmark::State& state) {
  Inputs in = make_inputs(state);
  std::vector<float> grad_tok(in.token_table.size()), grad_pos(in.position_table.size());
  for (auto _ : state) {
    embedding_backward(grad_tok, grad_pos, in.grad_out, in.tokens, in.positions, in.shape, {0.1, 1, 0});
    benchmark::DoNotOptimize(grad_tok.data());
  }
  set_bytes(state, in);
}

void BM_BackwardSparse(benchmark::State& state) {
  Inputs in = make_inputs(state);
  SparseRowGrad grad_tok;
  std::vector<float> grad_pos(in.position_table.size());
  for (auto _ : state) {
    zero_grad(grad_tok);
    embedding_backward(grad_tok, grad_pos, in.grad_out, in.tokens, in.positions, in.shape, {0.1, 1, 0});
    benchmark::DoNotOptimize(grad_tok.values.data());
  }
  set_bytes(state, in);
}

void BM_AdamWTokenTable(benchmark::State& state) {
  Inputs in = make_inputs(state);
  std::vector<float> grad(in.token_table.size(), 1e-3f), m(grad.size()), v(grad.size());
  std::int64_t step = 1;
  for (auto _ : state) adamw_step(in.token_table, grad, m, v, step++, {});
  // Parameter, gradient and both moments read; parameter and moments written.
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(7 * grad.size() * sizeof(float)));
}

// GPT-2 small (B 8, T 1024, d 768, V 50257) and a small shape (B 32, T 128, d 128, V 256).
#define POSEMBED_SHAPES ->Args({32, 128, 128, 256})->Args({8, 1024, 768, 50257})->Unit(benchmark::kMillisecond)->UseRealTime()
BENCHMARK(BM_ForwardEval) POSEMBED_SHAPES;
BENCHMARK(BM_ForwardTrain) POSEMBED_SHAPES;
BENCHMARK(BM_BackwardDense) POSEMBED_SHAPES;
BENCHMARK(BM_BackwardSparse) POSEMBED_SHAPES;
BENCHMARK(BM_AdamWTokenTable) POSEMBED_SHAPES;

}  // namespace
}  // namespace posembed

BENCHMARK_MAIN();
