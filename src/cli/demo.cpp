// `posembed demo`: one training step of the layer on a line of text, printed
// step by step: the bare layer, as the main command showed it before the trainer.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/config_flags.h"
#include "cli/flag_checks.h"
#include "posembed/core/layer.h"
#include "posembed/core/optim.h"
#include "posembed/core/parallel.h"
#include "posembed/core/position_ids.h"

namespace posembed::cli {
namespace {

struct DemoOptions {
  EmbeddingConfig layer{.vocab_size = 256, .max_seq_len = 64, .embed_dim = 32};
  std::string text = "learned absolute position embeddings";
  int threads = 0;
};

double l2_norm(std::span<const float> x) {
  double sum = 0;
  for (float v : x) sum += static_cast<double>(v) * v;
  return std::sqrt(sum);
}

void run_demo(const DemoOptions& options) {
  set_num_threads(options.threads);
  EmbeddingLayer layer = make_embedding_layer(options.layer);
  const EmbeddingConfig& c = layer.config;
  std::printf("layer: vocab_size %lld, max_seq_len %lld, embed_dim %lld, dropout %g, seed %llu\n",
              static_cast<long long>(c.vocab_size), static_cast<long long>(c.max_seq_len),
              static_cast<long long>(c.embed_dim), c.dropout,
              static_cast<unsigned long long>(c.seed));
  std::printf("  token table %s, position table %s (%lld of %lld parameters, %.1f%%)\n",
              to_string(c.token_init).c_str(), to_string(c.position_init).c_str(),
              static_cast<long long>(layer.position_table.size()),
              static_cast<long long>(layer.position_table.size() + layer.token_table.size()),
              100.0 * static_cast<double>(layer.position_table.size()) /
                  static_cast<double>(layer.position_table.size() + layer.token_table.size()));

  // A batch of one row: the text's bytes, positions 0..T-1.
  std::vector<std::int64_t> tokens(options.text.begin(), options.text.end());
  for (auto& t : tokens) t = static_cast<unsigned char>(t);
  const auto seq_len = static_cast<std::int64_t>(tokens.size());
  std::vector<std::int64_t> positions(tokens.size());
  positions_contiguous(positions, 1, seq_len, 0);
  const auto d = static_cast<std::size_t>(c.embed_dim);
  std::vector<float> out(tokens.size() * d);

  const DropoutSpec dropout = layer_forward(out, layer, tokens, positions, 1, seq_len, Mode::train);
  std::size_t zeros = 0;
  for (float v : out) zeros += v == 0.0f;
  std::printf("forward (train): \"%s\" -> (1, %lld, %lld); dropout step %llu zeroed %zu of %zu "
              "values (%.1f%%, p = %g)\n",
              options.text.c_str(), static_cast<long long>(seq_len),
              static_cast<long long>(c.embed_dim), static_cast<unsigned long long>(dropout.step),
              zeros, out.size(), 100.0 * static_cast<double>(zeros) / static_cast<double>(out.size()),
              c.dropout);

  // Loss 0.5 * ||out||^2, so the output gradient is out itself.
  double loss = 0;
  for (float v : out) loss += 0.5 * v * v;
  SparseRowGrad token_grad;
  std::vector<float> position_grad(layer.position_table.size(), 0.0f);
  embedding_backward(token_grad, position_grad, out, tokens, positions,
                     layer_shape(layer, 1, seq_len), dropout);
  std::printf("backward: loss 0.5*||out||^2 = %.6f; token gradient is row-sparse: %zu of %lld "
              "rows touched; position gradient norm %.6f\n",
              loss, token_grad.rows.size(), static_cast<long long>(c.vocab_size),
              l2_norm(position_grad));

  const AdamWConfig adamw{.lr = 1e-2, .weight_decay = 0.0};
  std::vector<float> m_tok(layer.token_table.size()), v_tok(m_tok.size());
  std::vector<float> m_pos(layer.position_table.size()), v_pos(m_pos.size());
  const double before_tok = l2_norm(layer.token_table), before_pos = l2_norm(layer.position_table);
  adamw_step(layer.token_table, token_grad, m_tok, v_tok, 1, adamw);
  adamw_step(layer.position_table, position_grad, m_pos, v_pos, 1, adamw);
  std::printf("AdamW step (lr %g): token table norm %.6f -> %.6f, position table norm %.6f -> "
              "%.6f\n",
              adamw.lr, before_tok, l2_norm(layer.token_table), before_pos,
              l2_norm(layer.position_table));

  std::vector<float> again(out.size());
  layer_forward(again, layer, tokens, positions, 1, seq_len, Mode::eval);
  double loss_after = 0;
  for (float v : again) loss_after += 0.5 * v * v;
  std::printf("eval forward after the step: loss %.6f (no dropout; it was %.6f with dropout)\n",
              loss_after, loss);
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto options = std::make_shared<DemoOptions>();
  CLI::App* demo = app.add_subcommand("demo", "one forward, backward and AdamW step, explained");
  add_config_flags(*demo, options->layer);
  demo->add_option("--text", options->text, "text whose bytes form the batch")->capture_default_str();
  demo->add_option("--threads", options->threads, "threads (0 = all cores)")->capture_default_str();
  demo->callback([options] {
    require_threads(options->threads);
    run_demo(*options);
  });
}

}  // namespace posembed::cli
