// posembed._C's position-id schemes (core/position_ids.h) over arrays.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <span>
#include <string>

#include "posembed/core/error.h"
#include "posembed/core/position_ids.h"
#include "python/arrays.h"
#include "python/bindings.h"

namespace posembed::python {
namespace {

using namespace nb::literals;

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
void positions_from_tokens_array(Out out, In input_ids, std::int64_t special_id) {
  const auto o = view<std::int64_t>(out, "position_ids", 2);
  const auto ids = view<const std::int64_t>(input_ids, "input_ids", 2);
  require_disjoint(o, "position_ids", ids, "input_ids");
  Scheme(o, ids, dim(input_ids, 0), dim(input_ids, 1), special_id);
}

void positions_from_cu_seqlens_array(Out out, In cu_seqlens) {
  const auto o = view<std::int64_t>(out, "position_ids", 1);
  const auto cu = view<const std::int64_t>(cu_seqlens, "cu_seqlens", 1);
  require_disjoint(o, "position_ids", cu, "cu_seqlens");
  positions_from_cu_seqlens(o, cu);
}

}  // namespace

void bind_positions(nb::module_& m) {
  m.def("positions_contiguous", &positions_contiguous_array, "out"_a, "offset"_a);
  m.def("positions_from_attention_mask",
        &positions_from_mask_array<posembed::positions_from_attention_mask>, "out"_a,
        "attention_mask"_a);
  m.def("positions_opt", &positions_from_mask_array<posembed::positions_opt>, "out"_a,
        "attention_mask"_a);
  m.def("positions_fairseq", &positions_from_tokens_array<posembed::positions_fairseq>, "out"_a,
        "input_ids"_a, "padding_idx"_a);
  m.def("positions_from_eos", &positions_from_tokens_array<posembed::positions_from_eos>, "out"_a,
        "input_ids"_a, "eos_token_id"_a);
  m.def("positions_from_cu_seqlens", &positions_from_cu_seqlens_array, "out"_a, "cu_seqlens"_a);
}

}  // namespace posembed::python
