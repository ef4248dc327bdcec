#include "posembed/core/layer.h"

#if defined(__linux__)
#include <sys/mman.h>  // madvise
#endif

#include <cstdint>
#include <fstream>
#include <string>

#include "posembed/core/error.h"
#include "posembed/core/init.h"

namespace posembed {

std::uint64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

void check_fits_in_memory(std::uint64_t bytes, std::string_view needs, std::string_view fix) {
  const std::uint64_t available = available_memory_bytes();
  if (available != 0 && bytes > available) {
    throw Error(std::string(needs) + " but only " + std::to_string(available) +
                " bytes of memory are available; " + std::string(fix));
  }
}

void advise_huge_pages(const void* begin, std::size_t bytes) {
#ifdef MADV_HUGEPAGE
  constexpr std::uintptr_t kHuge = std::uintptr_t{2} << 20;
  const auto start = reinterpret_cast<std::uintptr_t>(begin);
  const std::uintptr_t first = (start + kHuge - 1) / kHuge * kHuge;
  const std::uintptr_t last = (start + bytes) / kHuge * kHuge;
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#else
  (void)begin;
  (void)bytes;
#endif
}

void check_tables_fit_in_memory(const EmbeddingConfig& config) {
  const std::uint64_t token = table_bytes(config.vocab_size, config.embed_dim, "token table");
  const std::uint64_t position =
      table_bytes(config.max_seq_len, config.embed_dim, "position table");
  check_fits_in_memory(token + position,  // validate() ruled out overflow
                       "the tables need " + std::to_string(token + position) +
                           " bytes (token table " + std::to_string(token) + ", position table " +
                           std::to_string(position) +
                           "; training needs 4x that for gradients and AdamW state)",
                       "reduce vocab_size, max_seq_len or embed_dim");
}

EmbeddingLayer make_embedding_layer(const EmbeddingConfig& config) {
  validate(config);
  check_tables_fit_in_memory(config);
  EmbeddingLayer layer;
  layer.config = config;
  const auto d = static_cast<std::size_t>(config.embed_dim);
  assign_zeros_huge(layer.token_table, static_cast<std::size_t>(config.vocab_size) * d);
  assign_zeros_huge(layer.position_table, static_cast<std::size_t>(config.max_seq_len) * d);
  init_table(layer.token_table, config.token_init, config.embed_dim, config.seed,
             RandomStream::token_init);
  init_table(layer.position_table, config.position_init, config.embed_dim, config.seed,
             RandomStream::position_init);
  return layer;
}

EmbeddingShape layer_shape(const EmbeddingLayer& layer, std::int64_t batch, std::int64_t seq_len) {
  return {batch, seq_len, layer.config.vocab_size, layer.config.max_seq_len,
          layer.config.embed_dim};
}

DropoutSpec layer_forward(std::span<float> out, EmbeddingLayer& layer,
                          std::span<const std::int64_t> input_ids,
                          std::span<const std::int64_t> position_ids, std::int64_t batch,
                          std::int64_t seq_len, Mode mode) {
  const bool train = mode == Mode::train;
  const DropoutSpec dropout{train ? layer.config.dropout : 0.0, layer.config.seed,
                            layer.dropout_step};
  embedding_forward(out, input_ids, position_ids, layer.token_table, layer.position_table,
                    layer_shape(layer, batch, seq_len), dropout);
  if (train) ++layer.dropout_step;
  return dropout;
}

}  // namespace posembed
