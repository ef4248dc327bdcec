// posembed._C's layer: the fused forward and both backwards, the tables' initialisation
// and the configuration's checks. Kernels run with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "posembed/core/config.h"
#include "posembed/core/embedding.h"
#include "posembed/core/error.h"
#include "posembed/core/init.h"
#include "python/arrays.h"
#include "python/bindings.h"
#include "python/memory.h"

namespace posembed::python {
namespace {

using namespace nb::literals;

// Inputs of both kernels, checked against each other: ids (B, T), tables
// (V, d) and (P, d). A table may be absent (frozen in backward), so its rows
// come as numbers.
struct Batch {
  std::span<const std::int64_t> input_ids, position_ids;
  EmbeddingShape shape;
};

Batch batch_inputs(const In& input_ids, const In& position_ids, std::int64_t vocab_size,
                   std::int64_t max_seq_len, std::int64_t embed_dim, std::int64_t padding_row) {
  Batch b;
  b.input_ids = view<const std::int64_t>(input_ids, "input_ids", 2);
  b.position_ids = view<const std::int64_t>(position_ids, "position_ids", 2);
  b.shape = {dim(input_ids, 0), dim(input_ids, 1), vocab_size, max_seq_len, embed_dim, padding_row};
  require_shape("position_ids", shape_text(position_ids), dim(position_ids, 0),
                dim(position_ids, 1), b.shape.batch, b.shape.seq_len, ", the shape of input_ids");
  return b;
}

void forward(Out out, In input_ids, In position_ids, In token_table, In position_table,
             double dropout, std::uint64_t seed, std::uint64_t step, std::int64_t padding_row,
             std::optional<Out> mask_bits, bool uint16_is_bf16) {
  const auto token_span = tensor_view<true>(token_table, "token_table", 2, uint16_is_bf16);
  const auto position_span = tensor_view<true>(position_table, "position_table", 2, uint16_is_bf16);
  const auto tokens = bytes_of(token_span), positions = bytes_of(position_span);
  const std::int64_t d = dim(token_table, 1);
  require_shape(
      "position_table", shape_text(position_table), dim(position_table, 0), dim(position_table, 1),
      dim(position_table, 0), d,
      ": both tables have embed_dim columns (the token table has " + std::to_string(d) + ")");
  const Batch b = batch_inputs(input_ids, position_ids, dim(token_table, 0), dim(position_table, 0),
                               d, padding_row);
  const auto out_span = tensor_view<false>(out, "out", 3, uint16_is_bf16);
  const auto o = bytes_of(out_span);
  if (dim(out, 0) != b.shape.batch || dim(out, 1) != b.shape.seq_len || dim(out, 2) != d) {
    throw Error("out has shape " + shape_text(out) +
                " but must be (batch, seq_len, embed_dim) = (" + std::to_string(b.shape.batch) +
                ", " + std::to_string(b.shape.seq_len) + ", " + std::to_string(d) + ")");
  }
  require_disjoint(o, "out", tokens, "token_table");
  require_disjoint(o, "out", positions, "position_table");
  require_disjoint(o, "out", b.input_ids, "input_ids");
  require_disjoint(o, "out", b.position_ids, "position_ids");
  const auto mask = mask_view<std::uint64_t>(mask_bits);
  require_disjoint(mask, "mask_bits", o, "out");
  require_disjoint(mask, "mask_bits", tokens, "token_table");
  require_disjoint(mask, "mask_bits", positions, "position_table");
  require_disjoint(mask, "mask_bits", b.input_ids, "input_ids");
  require_disjoint(mask, "mask_bits", b.position_ids, "position_ids");
  nb::gil_scoped_release release;
  embedding_forward(out_span, b.input_ids, b.position_ids, token_span, position_span, b.shape,
                    {dropout, seed, step}, mask);
}

// The gradient tables and grad_out of both backward variants, checked.
struct BackwardArgs {
  Batch batch;
  TensorSpan grad_position;
  ConstTensorSpan grad_out;
};

BackwardArgs backward_args(const std::optional<Out>& grad_position_table, const In& grad_out,
                           const In& input_ids, const In& position_ids, std::int64_t vocab_size,
                           std::int64_t max_seq_len, std::int64_t padding_row, bool uint16_is_bf16) {
  BackwardArgs a;
  a.grad_out = tensor_view<true>(grad_out, "grad_out", 3, uint16_is_bf16);
  const std::int64_t d = dim(grad_out, 2);
  a.batch = batch_inputs(input_ids, position_ids, vocab_size, max_seq_len, d, padding_row);
  if (dim(grad_out, 0) != a.batch.shape.batch || dim(grad_out, 1) != a.batch.shape.seq_len) {
    throw Error("grad_out has shape " + shape_text(grad_out) + " but input_ids has shape " +
                shape_text(input_ids) + "; grad_out must be (batch, seq_len, embed_dim)");
  }
  if (grad_position_table) {
    a.grad_position = tensor_view<false>(*grad_position_table, "grad_position_table", 2, uint16_is_bf16);
    require_shape("grad_position_table", shape_text(*grad_position_table),
                  dim(*grad_position_table, 0), dim(*grad_position_table, 1), max_seq_len, d,
                  ", the position table's shape");
  }
  require_disjoint(bytes_of(a.grad_position), "grad_position_table", bytes_of(a.grad_out), "grad_out");
  return a;
}

void backward(std::optional<Out> grad_token_table, std::optional<Out> grad_position_table,
              In grad_out, In input_ids, In position_ids, std::int64_t vocab_size,
              std::int64_t max_seq_len, double dropout, std::uint64_t seed, std::uint64_t step,
              std::int64_t padding_row, bool accumulate, std::optional<In> mask_bits, bool uint16_is_bf16) {
  const BackwardArgs a = backward_args(grad_position_table, grad_out, input_ids, position_ids,
                                       vocab_size, max_seq_len, padding_row, uint16_is_bf16);
  TensorSpan grad_token;
  if (grad_token_table) {
    grad_token = tensor_view<false>(*grad_token_table, "grad_token_table", 2, uint16_is_bf16);
    require_shape("grad_token_table", shape_text(*grad_token_table), dim(*grad_token_table, 0),
                  dim(*grad_token_table, 1), vocab_size, a.batch.shape.embed_dim,
                  ", the token table's shape");
  }
  require_disjoint(bytes_of(grad_token), "grad_token_table", bytes_of(a.grad_out), "grad_out");
  require_disjoint(bytes_of(grad_token), "grad_token_table", bytes_of(a.grad_position), "grad_position_table");
  const auto mask = mask_view<const std::uint64_t>(mask_bits);
  require_disjoint(bytes_of(grad_token), "grad_token_table", mask, "mask_bits");
  require_disjoint(bytes_of(a.grad_position), "grad_position_table", mask, "mask_bits");
  nb::gil_scoped_release release;
  embedding_backward(grad_token, a.grad_position, a.grad_out, a.batch.input_ids,
                     a.batch.position_ids, a.batch.shape, {dropout, seed, step},
                     accumulate ? GradMode::accumulate : GradMode::write, mask);
}

using RowsArray = nb::ndarray<nb::numpy, std::int64_t, nb::ndim<1>>;
using ValuesArray = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

// Returns (rows (R,), values (R, d)): the token gradient's touched rows,
// ascending, as NumPy arrays that own the kernel's buffers (no copy).
std::tuple<RowsArray, ValuesArray> backward_sparse(
    std::optional<Out> grad_position_table, In grad_out, In input_ids, In position_ids,
    std::int64_t vocab_size, std::int64_t max_seq_len, double dropout, std::uint64_t seed,
    std::uint64_t step, std::int64_t padding_row, bool accumulate, std::optional<In> mask_bits,
    bool uint16_is_bf16) {
  const BackwardArgs a = backward_args(grad_position_table, grad_out, input_ids, position_ids,
                                       vocab_size, max_seq_len, padding_row, uint16_is_bf16);
  const auto mask = mask_view<const std::uint64_t>(mask_bits);
  require_disjoint(bytes_of(a.grad_position), "grad_position_table", mask, "mask_bits");
  // A pooled gradient keeps its storage from earlier steps: the kernel then
  // allocates nothing (zero_grad forgets the rows and keeps the buffers).
  auto grad = Pool<SparseRowGrad>::instance().take([](const SparseRowGrad&) { return true; });
  if (!grad) grad = std::make_unique<SparseRowGrad>();
  zero_grad(*grad);
  grad->embed_dim = a.batch.shape.embed_dim;
  {
    nb::gil_scoped_release release;
    embedding_backward(*grad, a.grad_position, a.grad_out, a.batch.input_ids, a.batch.position_ids,
                       a.batch.shape, {dropout, seed, step},
                       accumulate ? GradMode::accumulate : GradMode::write, mask);
  }
  const std::size_t rows = grad->rows.size();
  const auto d = static_cast<std::size_t>(grad->embed_dim);
  std::int64_t* row_data = grad->rows.data();
  float* value_data = grad->values.data();
  const nb::capsule owner = Pool<SparseRowGrad>::instance().lend(std::move(grad));
  return {RowsArray(row_data, {rows}, owner), ValuesArray(value_data, {rows, d}, owner)};
}

void zero_grad_array(Out grad) {
  const auto g = view<float>(grad, "grad", grad.ndim());
  nb::gil_scoped_release release;
  zero_grad(g);
}

RandomStream init_stream(const std::string& table) {
  if (table == "token") return RandomStream::token_init;
  if (table == "position") return RandomStream::position_init;
  throw Error("table '" + table + "' is neither 'token' nor 'position'");
}

void init_table_array(Out table, const std::string& init, std::uint64_t seed,
                      const std::string& which) {
  const auto t = view<float>(table, which + "_table", 2);
  const TableInit parsed = parse_table_init(init);
  const RandomStream stream = init_stream(which);
  const auto d = dim(table, 1);
  nb::gil_scoped_release release;
  init_table(t, parsed, d, seed, stream);
}

// Checks a layer configuration with the library's own rules and messages.
void validate_config(std::int64_t vocab_size, std::int64_t max_seq_len, std::int64_t embed_dim,
                     double dropout, std::uint64_t seed, const std::string& token_init,
                     const std::string& position_init) {
  EmbeddingConfig c{vocab_size,
                    max_seq_len,
                    embed_dim,
                    dropout,
                    seed,
                    parse_table_init(token_init),
                    parse_table_init(position_init)};
  validate(c);
}

// (name, default as text, help) of every EmbeddingConfig field, in order: the
// one place the defaults live, read by the Python module and its tests.
std::vector<std::tuple<std::string, std::string, std::string>> config_fields() {
  std::vector<std::tuple<std::string, std::string, std::string>> fields;
  EmbeddingConfig defaults;
  visit_fields(defaults, [&](const char* name, const auto& value, const char* help) {
    fields.emplace_back(name, field_to_string(value), help);
  });
  return fields;
}

}  // namespace

void bind_kernels(nb::module_& m) {
  m.def("forward", &forward, "out"_a, "input_ids"_a, "position_ids"_a, "token_table"_a,
        "position_table"_a, "dropout"_a, "seed"_a, "step"_a, "padding_row"_a = -1,
        "mask_bits"_a.none() = nb::none(), "uint16_is_bf16"_a = false,
        "out (B, T, d) = dropout(token_table[input_ids] + position_table[position_ids]); the "
        "mask is Philox(seed, step, flat index). mask_bits: None, or ceil(B*T*d / 64) int64 "
        "words that a forward with dropout > 0 fills with its mask, bit i % 64 of word i // 64 set "
        "where element i is kept, for the backwards. Tables float32, bfloat16 or float16 (both one "
        "dtype; uint16 arrays hold bfloat16 bits when uint16_is_bf16), out theirs or float32: "
        "float arithmetic, one rounding per element");
  m.def("backward", &backward, "grad_token_table"_a.none(), "grad_position_table"_a.none(),
        "grad_out"_a, "input_ids"_a, "position_ids"_a, "vocab_size"_a, "max_seq_len"_a, "dropout"_a,
        "seed"_a, "step"_a, "padding_row"_a = -1, "accumulate"_a = true,
        "mask_bits"_a.none() = nb::none(), "uint16_is_bf16"_a = false,
        "accumulates (+=) the gradients of forward, or with accumulate=False writes them "
        "(what the arrays held is ignored; the same bits as zeros + accumulate); None skips "
        "a table. mask_bits: the forward's, read instead of drawing the mask again (the same "
        "bits), or None. grad_out and each gradient float32, bfloat16 or float16: sums in "
        "float32, rounded once into a half gradient");
  m.def("backward_sparse", &backward_sparse, "grad_position_table"_a.none(), "grad_out"_a,
        "input_ids"_a, "position_ids"_a, "vocab_size"_a, "max_seq_len"_a, "dropout"_a, "seed"_a,
        "step"_a, "padding_row"_a = -1, "accumulate"_a = true, "mask_bits"_a.none() = nb::none(),
        "uint16_is_bf16"_a = false,
        "returns the token gradient as (rows, values float32), rows ascending; accumulates the "
        "position gradient unless None, or with accumulate=False writes it (as "
        "backward). mask_bits: as backward_dense's");
  m.def("zero_grad", &zero_grad_array, "grad"_a, "fills a float32 array with zeros");
  m.def("init_table", &init_table_array, "table"_a, "init"_a, "seed"_a, "which"_a,
        "fills a (rows, d) table as the C++ layer does: init 'normal:0.02', ...; which "
        "'token' or 'position'");
  m.def("validate_config", &validate_config, "vocab_size"_a, "max_seq_len"_a, "embed_dim"_a,
        "dropout"_a, "seed"_a, "token_init"_a, "position_init"_a);
  m.def("config_fields", &config_fields);
}

}  // namespace posembed::python
