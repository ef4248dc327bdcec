// The layer as one plain struct: its configuration, both tables, and the
// counter that keys each training forward's dropout mask. Gradients and
// optimizer state stay with the caller, who may share them (a tied output
// layer) or keep the token gradient row-sparse.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "posembed/core/aligned.h"
#include "posembed/core/config.h"
#include "posembed/core/embedding.h"

namespace posembed {

struct EmbeddingLayer {
  EmbeddingConfig config;
  LineFloats token_table;             // (vocab_size, embed_dim), on cache lines (aligned.h)
  LineFloats position_table;          // (max_seq_len, embed_dim)
  std::uint64_t dropout_step = 0;     // training forwards so far
};

// Validates the config, checks that the tables fit in this machine's memory
// and initialises both tables from config.seed.
EmbeddingLayer make_embedding_layer(const EmbeddingConfig& config);

// Memory is a property of the machine, not of the config (validate() stays
// machine-independent), so it is checked where memory is allocated, before the
// allocation.
// Bytes of memory the system can still give (MemAvailable), 0 when unknown.
std::uint64_t available_memory_bytes();
// Throws posembed::Error "<needs> but only N bytes of memory are available;
// <fix>" when `bytes` exceed available_memory_bytes(); no check when unknown.
void check_fits_in_memory(std::uint64_t bytes, std::string_view needs, std::string_view fix);
// The same for the layer's two tables; config must be valid.
void check_tables_fit_in_memory(const EmbeddingConfig& config);
// buffer = n zeros, asking Linux for transparent huge pages (madvise) before
// the pages are first touched, where the system leaves that to the program
// (THP "madvise" mode, Debian's default). A training step walks tens of MB
// of parameters and activations; with 4 KiB pages that is thousands of
// pages, more than the TLB holds. Elsewhere, or when refused, plain pages.
// The madvise of assign_zeros_huge over the whole 2 MiB pages inside [begin,
// begin + bytes); a refusal leaves plain pages.
void advise_huge_pages(const void* begin, std::size_t bytes);
// Any allocator (the bench's line-aligned arrays).
template <class Allocator>
void assign_zeros_huge(std::vector<float, Allocator>& buffer, std::size_t n) {
  buffer.clear();
  buffer.reserve(n);  // allocated, not yet touched
  advise_huge_pages(buffer.data(), n * sizeof(float));
  buffer.assign(n, 0.0f);
}

EmbeddingShape layer_shape(const EmbeddingLayer& layer, std::int64_t batch, std::int64_t seq_len);

enum class Mode { eval, train };

// out: (B, T, d). Returns the dropout that was applied; hand it to
// embedding_backward. A training forward advances layer.dropout_step, so the
// next one draws a fresh mask.
DropoutSpec layer_forward(std::span<float> out, EmbeddingLayer& layer,
                          std::span<const std::int64_t> input_ids,
                          std::span<const std::int64_t> position_ids, std::int64_t batch,
                          std::int64_t seq_len, Mode mode);

}  // namespace posembed
