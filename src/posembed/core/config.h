// The layer's configuration: one struct, defaults in one place. visit_fields()
// walks it, and that single walk drives the CLI flags, their help text, the
// checkpoint metadata and the parameter table of docs/library.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace posembed {

enum class InitKind {
  normal,        // N(0, std^2); GPT-2 uses std 0.02 for both tables
  scaled,        // N(0, 1/embed_dim), fairseq's choice
  trunc_normal,  // N(0, std^2) redrawn outside +-2 std, as the original BERT
  zeros,
};

struct TableInit {
  InitKind kind = InitKind::normal;
  double std = 0.02;  // ignored by `scaled` (1/sqrt(embed_dim)) and `zeros`
  bool operator==(const TableInit&) const = default;
};

// Text form used by flags and checkpoints: "normal:0.02", "trunc_normal:0.02",
// "scaled", "zeros"; a bare number means normal with that std.
std::string to_string(const TableInit& init);
TableInit parse_table_init(std::string_view text);
// The std actually drawn with, 0 for zeros.
double effective_std(const TableInit& init, std::int64_t embed_dim);

struct EmbeddingConfig {
  std::int64_t vocab_size = 50257;   // GPT-2's byte-pair vocabulary
  std::int64_t max_seq_len = 1024;   // rows of the position table
  std::int64_t embed_dim = 768;      // width of both tables
  double dropout = 0.1;              // GPT-2's embd_pdrop
  std::uint64_t seed = 1337;
  TableInit token_init{};
  TableInit position_init{};
  bool operator==(const EmbeddingConfig&) const = default;
};

// Calls visitor(name, field, help) for every field, in a fixed order.
template <class Config, class Visitor>
void visit_fields(Config& config, Visitor&& visitor) {
  visitor("vocab_size", config.vocab_size, "rows of the token table; ids lie in [0, vocab_size)");
  visitor("max_seq_len", config.max_seq_len,
          "rows of the position table: the longest sequence the layer can embed. Memory grows "
          "linearly with it; attention cost grows quadratically with the sequence length");
  visitor("embed_dim", config.embed_dim,
          "width of both tables (the model width); must equal the token table's width");
  visitor("dropout", config.dropout,
          "probability of zeroing an element of the sum in training (inverted dropout, kept "
          "values scaled by 1/(1-p)); 0.1 as GPT-2");
  visitor("seed", config.seed, "seed of the initialisation and of every dropout mask");
  visitor("token_init", config.token_init,
          "token table initialisation: normal:STD, trunc_normal:STD, scaled (1/sqrt(embed_dim)) "
          "or zeros");
  visitor("position_init", config.position_init,
          "position table initialisation: normal:STD, trunc_normal:STD, scaled or zeros");
}

// Text conversion of one field, for metadata and flags.
std::string field_to_string(std::int64_t value);
std::string field_to_string(std::uint64_t value);
std::string field_to_string(double value);  // round-trips exactly
std::string field_to_string(const TableInit& value);
void field_from_string(std::string_view name, std::string_view text, std::int64_t& value);
void field_from_string(std::string_view name, std::string_view text, std::uint64_t& value);
void field_from_string(std::string_view name, std::string_view text, double& value);
void field_from_string(std::string_view name, std::string_view text, TableInit& value);

// Bytes of one fp32 table; throws posembed::Error when rows * cols * 4 overflows.
std::uint64_t table_bytes(std::int64_t rows, std::int64_t cols, std::string_view table_name);

// Throws posembed::Error naming the field, its value, the limit and a fix.
// Depends on the config alone, never on the machine: a config that is valid
// here is valid everywhere (a checkpoint's metadata, say). Whether the tables
// fit in this machine's memory is checked where they are allocated
// (make_embedding_layer, check_tables_fit_in_memory in layer.h).
void validate(const EmbeddingConfig& config);

}  // namespace posembed
