// posembed._C: the library's kernels over arrays, for the Python package.
//
// Functions take NumPy arrays or torch tensors (DLPack) and read and write their
// own memory: no copies. Every array is checked here (CPU, dtype, shape,
// C-contiguous, outputs not overlapping inputs) before any kernel runs, so a bad
// argument raises ValueError (IndexError for an id outside its table) with
// posembed's message and leaves every output untouched. Kernels run with the GIL
// released. The Python layer (python/posembed) builds the user-facing API on top.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "posembed/core/config.h"
#include "posembed/core/embedding.h"
#include "posembed/core/error.h"
#include "posembed/core/init.h"
#include "posembed/core/parallel.h"
#include "posembed/core/position_ids.h"
#include "posembed/core/simd.h"
#include "posembed/io/inspect.h"
#include "posembed/io/resize.h"
#include "posembed/tools/analyze.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace posembed::python {
namespace {

using In = nb::ndarray<nb::ro>;  // any dtype, device and layout: checked below
using Out = nb::ndarray<>;

std::string dtype_name(nb::dlpack::dtype t) {
  const char* kind = "?";
  switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
    case nb::dlpack::dtype_code::Int:
      kind = "int";
      break;
    case nb::dlpack::dtype_code::UInt:
      kind = "uint";
      break;
    case nb::dlpack::dtype_code::Float:
      kind = "float";
      break;
    case nb::dlpack::dtype_code::Bfloat:
      kind = "bfloat";
      break;
    case nb::dlpack::dtype_code::Bool:
      return "bool";
    default:
      break;
  }
  return kind + std::to_string(t.bits);
}

template <class Array>
std::string shape_text(const Array& a) {
  std::string s = "(";
  for (std::size_t i = 0; i < a.ndim(); ++i) {
    s += (i ? ", " : "") + std::to_string(a.shape(i));
  }
  return s + (a.ndim() == 1 ? ",)" : ")");
}

// The array's elements as a span after checking that they are what a kernel
// may read (or write) as a flat, row-major block of T on the CPU.
template <class T, class Array>
std::span<T> view(const Array& a, const std::string& name, std::size_t ndim) {
  using Scalar = std::remove_const_t<T>;
  if (a.device_type() != nb::device::cpu::value) {
    throw Error(name + " is on a device of DLPack type " + std::to_string(a.device_type()) +
                " (2 = CUDA), not the CPU; posembed's kernels run on the CPU: move it with "
                ".cpu()");
  }
  if (a.dtype() != nb::dtype<Scalar>()) {
    const std::string want = dtype_name(nb::dtype<Scalar>());
    throw Error(name + " has dtype " + dtype_name(a.dtype()) + " but posembed needs " + want +
                (std::is_floating_point_v<Scalar>
                     ? "; convert it with .float() (torch) or .astype(numpy.float32)"
                     : "; convert it with .long() (torch) or .astype(numpy.int64)"));
  }
  if (a.ndim() != ndim) {
    throw Error(name + " has shape " + shape_text(a) + " (" + std::to_string(a.ndim()) +
                " dimensions) but must have " + std::to_string(ndim));
  }
  // Row-major strides in elements; size-1 dimensions, and empty arrays, may have any.
  std::int64_t expected = 1;
  for (std::size_t i = a.ndim(); a.size() > 0 && i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expected) {
      throw Error(name + " of shape " + shape_text(a) +
                  " is not C-contiguous (a view, a transpose or a slice); pass "
                  ".contiguous() (torch) or numpy.ascontiguousarray(...)");
    }
    expected *= static_cast<std::int64_t>(a.shape(i));
  }
  return {static_cast<T*>(a.data()), a.size()};
}

template <class T>
std::span<T> view_optional(const std::optional<Out>& a, const std::string& name, std::size_t ndim) {
  return a ? view<T>(*a, name, ndim) : std::span<T>{};
}

template <class Array>
std::int64_t dim(const Array& a, std::size_t i) {
  return static_cast<std::int64_t>(a.shape(i));
}

void require_shape(const std::string& name, const std::string& actual, std::int64_t got0,
                   std::int64_t got1, std::int64_t want0, std::int64_t want1,
                   const std::string& why) {
  if (got0 != want0 || got1 != want1) {
    throw Error(name + " has shape " + actual + " but must be (" + std::to_string(want0) + ", " +
                std::to_string(want1) + ")" + why);
  }
}

// An output that shares memory with an input would be read after being
// written; refuse it before anything runs.
template <class A, class B>
void require_disjoint(std::span<A> out, const std::string& out_name, std::span<B> in,
                      const std::string& in_name) {
  if (out.empty() || in.empty()) return;
  const auto* o0 = reinterpret_cast<const std::byte*>(out.data());
  const auto* i0 = reinterpret_cast<const std::byte*>(in.data());
  if (o0 < i0 + in.size_bytes() && i0 < o0 + out.size_bytes()) {
    throw Error(out_name + " shares memory with " + in_name +
                "; pass a separate output array (a fresh torch.empty / numpy.empty)");
  }
}

// The dropout mask's words (core/embedding.h's mask_bits) arrive as int64,
// the same 64 bits each: torch has no uint64 tensors before 2.3. Their count
// is checked by the kernels.
template <class Word, class Array>
std::span<Word> mask_view(const std::optional<Array>& a) {
  if (!a) return {};
  using Stored = std::conditional_t<std::is_const_v<Word>, const std::int64_t, std::int64_t>;
  const std::span<Stored> words = view<Stored>(*a, "mask_bits", 1);
  return {reinterpret_cast<Word*>(words.data()), words.size()};
}

// Inputs of both kernels, checked against each other: ids (B, T), tables
// (V, d) and (P, d). A table may be absent (frozen in backward), so its rows
// come as numbers.
struct Batch {
  std::span<const std::int64_t> token_ids, position_ids;
  EmbeddingShape shape;
};

Batch batch_inputs(const In& token_ids, const In& position_ids, std::int64_t vocab_size,
                   std::int64_t max_seq_len, std::int64_t embed_dim, std::int64_t padding_row) {
  Batch b;
  b.token_ids = view<const std::int64_t>(token_ids, "input_ids", 2);
  b.position_ids = view<const std::int64_t>(position_ids, "position_ids", 2);
  b.shape = {dim(token_ids, 0), dim(token_ids, 1), vocab_size, max_seq_len, embed_dim, padding_row};
  require_shape("position_ids", shape_text(position_ids), dim(position_ids, 0),
                dim(position_ids, 1), b.shape.batch, b.shape.seq_len, ", the shape of input_ids");
  return b;
}

void forward(Out out, In token_ids, In position_ids, In token_table, In position_table, double p,
             std::uint64_t seed, std::uint64_t step, std::int64_t padding_row,
             std::optional<Out> mask_bits) {
  const auto tokens = view<const float>(token_table, "token_table", 2);
  const auto positions = view<const float>(position_table, "position_table", 2);
  const std::int64_t d = dim(token_table, 1);
  require_shape(
      "position_table", shape_text(position_table), dim(position_table, 0), dim(position_table, 1),
      dim(position_table, 0), d,
      ": both tables have embed_dim columns (the token table has " + std::to_string(d) + ")");
  const Batch b = batch_inputs(token_ids, position_ids, dim(token_table, 0), dim(position_table, 0),
                               d, padding_row);
  const auto o = view<float>(out, "out", 3);
  if (dim(out, 0) != b.shape.batch || dim(out, 1) != b.shape.seq_len || dim(out, 2) != d) {
    throw Error("out has shape " + shape_text(out) +
                " but must be (batch, seq_len, embed_dim) = (" + std::to_string(b.shape.batch) +
                ", " + std::to_string(b.shape.seq_len) + ", " + std::to_string(d) + ")");
  }
  require_disjoint(o, "out", tokens, "token_table");
  require_disjoint(o, "out", positions, "position_table");
  require_disjoint(o, "out", b.token_ids, "input_ids");
  require_disjoint(o, "out", b.position_ids, "position_ids");
  const auto mask = mask_view<std::uint64_t>(mask_bits);
  require_disjoint(mask, "mask_bits", o, "out");
  require_disjoint(mask, "mask_bits", tokens, "token_table");
  require_disjoint(mask, "mask_bits", positions, "position_table");
  require_disjoint(mask, "mask_bits", b.token_ids, "input_ids");
  require_disjoint(mask, "mask_bits", b.position_ids, "position_ids");
  nb::gil_scoped_release release;
  embedding_forward(o, b.token_ids, b.position_ids, tokens, positions, b.shape, {p, seed, step}, mask);
}

// The gradient tables and grad_out of both backward variants, checked.
struct BackwardArgs {
  Batch batch;
  std::span<float> grad_position;
  std::span<const float> grad_out;
};

BackwardArgs backward_args(const std::optional<Out>& grad_position_table, const In& grad_out,
                           const In& token_ids, const In& position_ids, std::int64_t vocab_size,
                           std::int64_t max_seq_len, std::int64_t padding_row) {
  BackwardArgs a;
  a.grad_out = view<const float>(grad_out, "grad_out", 3);
  const std::int64_t d = dim(grad_out, 2);
  a.batch = batch_inputs(token_ids, position_ids, vocab_size, max_seq_len, d, padding_row);
  if (dim(grad_out, 0) != a.batch.shape.batch || dim(grad_out, 1) != a.batch.shape.seq_len) {
    throw Error("grad_out has shape " + shape_text(grad_out) + " but input_ids has shape " +
                shape_text(token_ids) + "; grad_out must be (batch, seq_len, embed_dim)");
  }
  a.grad_position = view_optional<float>(grad_position_table, "grad_position_table", 2);
  if (grad_position_table) {
    require_shape("grad_position_table", shape_text(*grad_position_table),
                  dim(*grad_position_table, 0), dim(*grad_position_table, 1), max_seq_len, d,
                  ", the position table's shape");
  }
  require_disjoint(a.grad_position, "grad_position_table", a.grad_out, "grad_out");
  return a;
}

void backward_dense(std::optional<Out> grad_token_table, std::optional<Out> grad_position_table,
                    In grad_out, In token_ids, In position_ids, std::int64_t vocab_size,
                    std::int64_t max_seq_len, double p, std::uint64_t seed, std::uint64_t step,
                    std::int64_t padding_row, bool accumulate, std::optional<In> mask_bits) {
  const BackwardArgs a = backward_args(grad_position_table, grad_out, token_ids, position_ids,
                                       vocab_size, max_seq_len, padding_row);
  const auto grad_token = view_optional<float>(grad_token_table, "grad_token_table", 2);
  if (grad_token_table) {
    require_shape("grad_token_table", shape_text(*grad_token_table), dim(*grad_token_table, 0),
                  dim(*grad_token_table, 1), vocab_size, a.batch.shape.embed_dim,
                  ", the token table's shape");
  }
  require_disjoint(grad_token, "grad_token_table", a.grad_out, "grad_out");
  require_disjoint(grad_token, "grad_token_table", a.grad_position, "grad_position_table");
  const auto mask = mask_view<const std::uint64_t>(mask_bits);
  require_disjoint(grad_token, "grad_token_table", mask, "mask_bits");
  require_disjoint(a.grad_position, "grad_position_table", mask, "mask_bits");
  nb::gil_scoped_release release;
  embedding_backward(grad_token, a.grad_position, a.grad_out, a.batch.token_ids,
                     a.batch.position_ids, a.batch.shape, {p, seed, step},
                     accumulate ? GradMode::accumulate : GradMode::write, mask);
}

// Storage handed to Python that comes back when Python frees it. A new 154 MB
// token gradient (GPT-2) from the system allocator costs a page fault per 4 KiB
// on first touch, which took three times the backward kernel itself; as
// PyTorch's CUDA caching allocator does, freed storage returns to a small pool
// and the next call reuses it. At most kMaxFree items wait in a pool.
template <class Item>
class Pool {
 public:
  static constexpr std::size_t kMaxFree = 4;

  // A free item that `fits`, or nullptr.
  template <class Fits>
  std::unique_ptr<Item> take(Fits fits) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (fits(**it)) {
        std::unique_ptr<Item> item = std::move(*it);
        free_.erase(it);
        return item;
      }
    }
    return nullptr;
  }

  void give_back(std::unique_ptr<Item> item) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (free_.size() < kMaxFree) free_.push_back(std::move(item));
  }

  void clear() {
    const std::lock_guard<std::mutex> lock(mutex_);
    free_.clear();
  }

  // Python owns `item` through the returned capsule; when Python frees it, the
  // item comes back to this pool.
  nb::capsule lend(std::unique_ptr<Item> item) {
    return nb::capsule(item.release(), [](void* p) noexcept {
      instance().give_back(std::unique_ptr<Item>(static_cast<Item*>(p)));
    });
  }

  static Pool& instance() {
    static auto* pool = new Pool;  // never destroyed: torch may free tensors at exit
    return *pool;
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<Item>> free_;
};

// A 2 MiB-aligned float block, advised as huge pages where the kernel allows.
struct Block {
  explicit Block(std::size_t n) : floats(n) {
    constexpr std::size_t kAlign = std::size_t{1} << 21;
    const std::size_t bytes = std::max<std::size_t>(1, (n * sizeof(float) + kAlign - 1) / kAlign) * kAlign;
    data = static_cast<float*>(std::aligned_alloc(kAlign, bytes));
    if (data == nullptr) throw std::bad_alloc();
    madvise(data, bytes, MADV_HUGEPAGE);  // advice only
  }
  ~Block() { std::free(data); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  std::size_t floats;
  float* data;
};

using TorchMatrix = nb::ndarray<nb::pytorch, float, nb::ndim<2>, nb::c_contig>;

// An uninitialised (rows, cols) float32 torch tensor from the block pool: for
// fresh gradients and outputs.
TorchMatrix empty_float32(std::size_t rows, std::size_t cols) {
  const std::size_t n = checked_product(rows, cols, "empty_float32");
  auto block = Pool<Block>::instance().take([n](const Block& b) { return b.floats == n; });
  if (!block) block = std::make_unique<Block>(n);
  float* data = block->data;
  return {data, {rows, cols}, Pool<Block>::instance().lend(std::move(block))};
}

void empty_cache() {
  Pool<Block>::instance().clear();
  Pool<SparseRowGrad>::instance().clear();
}

using RowsArray = nb::ndarray<nb::numpy, std::int64_t, nb::ndim<1>>;
using ValuesArray = nb::ndarray<nb::numpy, float, nb::ndim<2>>;

// Returns (rows (R,), values (R, d)): the token gradient's touched rows,
// ascending, as NumPy arrays that own the kernel's buffers (no copy).
std::tuple<RowsArray, ValuesArray> backward_sparse(std::optional<Out> grad_position_table,
                                                   In grad_out, In token_ids, In position_ids,
                                                   std::int64_t vocab_size,
                                                   std::int64_t max_seq_len, double p,
                                                   std::uint64_t seed, std::uint64_t step,
                                                   std::int64_t padding_row, bool accumulate,
                                                   std::optional<In> mask_bits) {
  const BackwardArgs a = backward_args(grad_position_table, grad_out, token_ids, position_ids,
                                       vocab_size, max_seq_len, padding_row);
  const auto mask = mask_view<const std::uint64_t>(mask_bits);
  require_disjoint(a.grad_position, "grad_position_table", mask, "mask_bits");
  // A pooled gradient keeps its storage from earlier steps: the kernel then
  // allocates nothing (zero_grad forgets the rows and keeps the buffers).
  auto grad = Pool<SparseRowGrad>::instance().take([](const SparseRowGrad&) { return true; });
  if (!grad) grad = std::make_unique<SparseRowGrad>();
  zero_grad(*grad);
  grad->embed_dim = a.batch.shape.embed_dim;
  {
    nb::gil_scoped_release release;
    embedding_backward(*grad, a.grad_position, a.grad_out, a.batch.token_ids, a.batch.position_ids,
                       a.batch.shape, {p, seed, step}, accumulate ? GradMode::accumulate : GradMode::write,
                       mask);
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

void positions_contiguous_array(Out out, std::int64_t offset) {
  const auto o = view<std::int64_t>(out, "position_ids", 2);
  positions_contiguous(o, dim(out, 0), dim(out, 1), offset);
}

// The mask-based schemes (Hugging Face generate(), OPT) share one signature.
template <void (*Scheme)(std::span<std::int64_t>, std::span<const std::int64_t>, std::int64_t,
                         std::int64_t, std::int64_t)>
void positions_from_mask_array(Out out, In attention_mask) {
  const auto o = view<std::int64_t>(out, "position_ids", 2);
  const auto mask = view<const std::int64_t>(attention_mask, "attention_mask", 2);
  if (dim(attention_mask, 0) != dim(out, 0)) {
    throw Error("attention_mask has " + std::to_string(dim(attention_mask, 0)) +
                " rows but the batch has " + std::to_string(dim(out, 0)));
  }
  require_disjoint(o, "position_ids", mask, "attention_mask");
  Scheme(o, mask, dim(out, 0), dim(attention_mask, 1), dim(out, 1));
}

// The token-based schemes (fairseq padding, Megatron end-of-document).
template <void (*Scheme)(std::span<std::int64_t>, std::span<const std::int64_t>, std::int64_t,
                         std::int64_t, std::int64_t)>
void positions_from_tokens_array(Out out, In token_ids, std::int64_t special_id) {
  const auto o = view<std::int64_t>(out, "position_ids", 2);
  const auto ids = view<const std::int64_t>(token_ids, "input_ids", 2);
  require_disjoint(o, "position_ids", ids, "input_ids");
  Scheme(o, ids, dim(token_ids, 0), dim(token_ids, 1), special_id);
}

void positions_from_cu_seqlens_array(Out out, In cu_seqlens) {
  const auto o = view<std::int64_t>(out, "position_ids", 1);
  const auto cu = view<const std::int64_t>(cu_seqlens, "cu_seqlens", 1);
  require_disjoint(o, "position_ids", cu, "cu_seqlens");
  positions_from_cu_seqlens(o, cu);
}

io::DetectOptions detect(const std::optional<std::string>& name,
                         std::optional<std::int64_t> offset) {
  io::DetectOptions options;
  options.position_name = name;
  options.offset_rows = offset;
  return options;
}

std::string inspect_json(const std::string& path, std::optional<std::string> name,
                         std::optional<std::int64_t> offset) {
  return io::inspect_json(path, detect(name, offset));
}

nb::dict resize(const std::string& in, const std::string& out, std::int64_t max_seq_len,
                const std::string& method, std::optional<std::string> name,
                std::optional<std::int64_t> offset, std::optional<std::string> init,
                std::optional<std::uint64_t> seed) {
  io::ResizeOptions options;
  options.max_seq_len = max_seq_len;
  options.method = io::parse_resize_method(method);
  options.detect = detect(name, offset);
  if (init) options.init = parse_table_init(*init);
  options.seed = seed;
  io::ResizeReport r;
  {
    nb::gil_scoped_release release;
    r = io::resize_checkpoint(in, out, options);
  }
  nb::dict d;
  d["input"] = in;
  d["output"] = out;
  d["tensor"] = r.position_name;
  d["family"] = r.tables.family;
  d["dtype"] = std::string(io::dtype_name(r.dtype));
  d["method"] = std::string(io::to_string(r.rows.method));
  d["offset_rows"] = r.rows.offset_rows;
  d["old_max_seq_len"] = r.rows.old_len;
  d["max_seq_len"] = r.rows.new_len;
  d["embed_dim"] = r.rows.embed_dim;
  if (r.rows.method == io::ResizeMethod::init) {
    d["init"] = to_string(r.rows.init);
    d["seed"] = r.rows.seed;
  }
  d["tensors_copied"] = r.tensors_copied;
  d["notes"] = r.notes;
  return d;
}

template <class T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> owned_vector(std::vector<T> values) {
  auto* heap = new std::vector<T>(std::move(values));
  nb::capsule owner(heap, [](void* v) noexcept { delete static_cast<std::vector<T>*>(v); });
  return {heap->data(), {heap->size()}, owner};
}

nb::dict analyze(In table) {
  const auto t = view<const float>(table, "table", 2);
  tools::TableAnalysis a;
  {
    nb::gil_scoped_release release;
    a = tools::analyze_table(t, dim(table, 0), dim(table, 1));
  }
  nb::dict d;
  d["rows"] = a.rows;
  d["cols"] = a.cols;
  d["components_90"] = a.components_90;
  d["components_95"] = a.components_95;
  d["components_99"] = a.components_99;
  d["participation_ratio"] = a.participation_ratio;
  d["gap_rank"] = a.gap_rank;
  d["gap_ratio"] = a.gap_ratio;
  d["mean_row_norm"] = a.mean_row_norm;
  d["zero_rows"] = a.zero_rows;
  d["singular_values"] = owned_vector(std::move(a.singular_values));
  d["variance_ratio"] = owned_vector(std::move(a.variance_ratio));
  d["row_norms"] = owned_vector(std::move(a.row_norms));
  d["neighbour_cosine"] = owned_vector(std::move(a.neighbour_cosine));
  return d;
}

// A class of posembed.errors (a module that imports nothing of ours), alive as long as that
// module is imported: the pointer is borrowed.
PyObject* error_class(const char* name) {
  return nb::module_::import_("posembed.errors").attr(name).ptr();
}

}  // namespace
}  // namespace posembed::python

NB_MODULE(_C, m) {
  namespace py = posembed::python;
  m.doc() = "posembed's C++ kernels over NumPy arrays and torch tensors (no copies)";
  // posembed.errors' classes also derive from the built-in ones (IndexError; ValueError and
  // RuntimeError), so code written for nn.Embedding's errors catches ours.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const posembed::OutOfRange& e) {
      PyErr_SetString(py::error_class("IdOutOfRangeError"), e.what());
    } catch (const posembed::Error& e) {
      PyErr_SetString(py::error_class("InvalidInputError"), e.what());
    }
  });

  m.def("forward", &py::forward, "out"_a, "input_ids"_a, "position_ids"_a, "token_table"_a,
        "position_table"_a, "p"_a, "seed"_a, "step"_a, "padding_row"_a = -1,
        "mask_bits"_a.none() = nb::none(),
        "out (B, T, d) = dropout(token_table[input_ids] + position_table[position_ids]); the "
        "mask is Philox(seed, step, flat index). mask_bits: None, or ceil(B*T*d / 64) int64 "
        "words that a forward with p > 0 fills with its mask, bit i % 64 of word i // 64 set "
        "where element i is kept, for the backwards");
  m.def("backward_dense", &py::backward_dense, "grad_token_table"_a.none(),
        "grad_position_table"_a.none(), "grad_out"_a, "input_ids"_a, "position_ids"_a,
        "vocab_size"_a, "max_seq_len"_a, "p"_a, "seed"_a, "step"_a, "padding_row"_a = -1,
        "accumulate"_a = true, "mask_bits"_a.none() = nb::none(),
        "accumulates (+=) the gradients of forward, or with accumulate=False writes them "
        "(what the arrays held is ignored; the same bits as zeros + accumulate); None skips "
        "a table. mask_bits: the forward's, read instead of drawing the mask again (the same "
        "bits), or None");
  m.def("backward_sparse", &py::backward_sparse, "grad_position_table"_a.none(), "grad_out"_a,
        "input_ids"_a, "position_ids"_a, "vocab_size"_a, "max_seq_len"_a, "p"_a, "seed"_a, "step"_a,
        "padding_row"_a = -1, "accumulate"_a = true, "mask_bits"_a.none() = nb::none(),
        "returns the token gradient as (rows, values), rows ascending; accumulates the "
        "position gradient unless None, or with accumulate=False writes it (as "
        "backward_dense). mask_bits: as backward_dense's");
  m.def("zero_grad", &py::zero_grad_array, "grad"_a, "fills a float32 array with zeros");
  m.def("empty_float32", &py::empty_float32, "rows"_a, "cols"_a,
        "an uninitialised float32 torch tensor whose memory posembed reuses once torch frees it");
  m.def("empty_cache", &py::empty_cache, "frees the storage kept for reuse");
  m.def("init_table", &py::init_table_array, "table"_a, "init"_a, "seed"_a, "which"_a,
        "fills a (rows, d) table as the C++ layer does: init 'normal:0.02', ...; which "
        "'token' or 'position'");
  m.def("validate_config", &py::validate_config, "vocab_size"_a, "max_seq_len"_a, "embed_dim"_a,
        "dropout"_a, "seed"_a, "token_init"_a, "position_init"_a);
  m.def("config_fields", &py::config_fields);
  m.def("positions_contiguous", &py::positions_contiguous_array, "out"_a, "offset"_a);
  m.def("positions_from_attention_mask",
        &py::positions_from_mask_array<posembed::positions_from_attention_mask>, "out"_a,
        "attention_mask"_a);
  m.def("positions_opt", &py::positions_from_mask_array<posembed::positions_opt>, "out"_a,
        "attention_mask"_a);
  m.def("positions_fairseq", &py::positions_from_tokens_array<posembed::positions_fairseq>, "out"_a,
        "input_ids"_a, "padding_idx"_a);
  m.def("positions_from_eos", &py::positions_from_tokens_array<posembed::positions_from_eos>,
        "out"_a, "input_ids"_a, "eos_token_id"_a);
  m.def("positions_from_cu_seqlens", &py::positions_from_cu_seqlens_array, "out"_a, "cu_seqlens"_a);
  m.def("inspect_json", &py::inspect_json, "path"_a, "name"_a = nb::none(),
        "offset"_a = nb::none());
  m.def("resize", &py::resize, "path"_a, "out"_a, "max_seq_len"_a, "method"_a,
        "name"_a = nb::none(), "offset"_a = nb::none(), "init"_a = nb::none(),
        "seed"_a = nb::none());
  m.def("analyze", &py::analyze, "table"_a);
  m.def("set_num_threads", &posembed::set_num_threads, "threads"_a);
  m.def("num_threads", &posembed::num_threads);
  m.def("simd_target", [] { return std::string(posembed::simd::target_name()); });
}
