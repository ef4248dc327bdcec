// Checks of the arrays that posembed._C's functions take: NumPy arrays or torch tensors
// (DLPack), read and written in place. Every array is checked (CPU, dtype, shape,
// C-contiguous, outputs not overlapping inputs) before any kernel runs, so a bad argument
// raises posembed's error and leaves every output untouched.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>

#include "posembed/core/embedding.h"
#include "posembed/core/error.h"

namespace posembed::python {

namespace nb = nanobind;

using In = nb::ndarray<nb::ro>;  // any dtype, device and layout: checked below
using Out = nb::ndarray<>;

inline std::string dtype_name(nb::dlpack::dtype t) {
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

// Checks that the array is what a kernel may read (or write) as a flat,
// row-major block on the CPU, whatever its dtype.
template <class Array>
void check_layout(const Array& a, const std::string& name, std::size_t ndim) {
  if (a.device_type() != nb::device::cpu::value) {
    throw Error(name + " is on a device of DLPack type " + std::to_string(a.device_type()) +
                " (2 = CUDA), not the CPU; posembed's kernels run on the CPU: move it with "
                ".cpu()");
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
}

// The array's elements as a span after checking that they are what a kernel
// may read (or write) as a flat, row-major block of T on the CPU.
template <class T, class Array>
std::span<T> view(const Array& a, const std::string& name, std::size_t ndim) {
  using Scalar = std::remove_const_t<T>;
  if (a.dtype() != nb::dtype<Scalar>()) {
    const std::string want = dtype_name(nb::dtype<Scalar>());
    throw Error(name + " has dtype " + dtype_name(a.dtype()) + " but posembed needs " + want +
                (std::is_floating_point_v<Scalar>
                     ? "; convert it with .float() (torch) or .astype(numpy.float32)"
                     : "; convert it with .long() (torch) or .astype(numpy.int64)"));
  }
  check_layout(a, name, ndim);
  return {static_cast<T*>(a.data()), a.size()};
}

// A table, output, gradient or grad_out of float32, bfloat16 or float16, as
// the dtype-aware kernels take it: torch.bfloat16 arrives as DLPack's
// bfloat16; NumPy has none, so there bf16 is uint16 holding its bits, read as
// bf16 only when the caller says so (uint16_is_bf16: Python's dtype="bfloat16").
template <bool kConst, class Array>
BasicTensorSpan<kConst> tensor_view(const Array& a, const std::string& name, std::size_t ndim,
                                    bool uint16_is_bf16) {
  const nb::dlpack::dtype t = a.dtype();
  const auto as = [&]<class T>(T) {
    using Element = std::conditional_t<kConst, const T, T>;
    return std::span<Element>(static_cast<Element*>(a.data()), a.size());
  };
  if (t == nb::dtype<float>()) {
    check_layout(a, name, ndim);
    return as(0.0f);
  }
  const bool bf16_bits = uint16_is_bf16 && t == nb::dtype<std::uint16_t>();
  const bool bf16_type = t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat) && t.bits == 16;
  const bool f16 = t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float) && t.bits == 16;
  if ((!bf16_bits && !bf16_type && !f16) || t.lanes != 1) {
    // int16 is how torch 1.13 hands out bf16 bits (t.view(torch.int16).numpy()):
    // astype would read those bits as numbers.
    const char* fix = t == nb::dtype<std::uint16_t>()
                          ? " (uint16 holding bfloat16 bits: pass dtype=\"bfloat16\")"
                      : t == nb::dtype<std::int16_t>()
                          ? "; if it holds bfloat16 bits, view them as such: a NumPy array as "
                            ".view(numpy.uint16) with dtype=\"bfloat16\", a torch tensor as "
                            ".view(torch.bfloat16); if it holds numbers, convert it to float32"
                          : "; convert it with .float() (torch) or .astype(numpy.float32)";
    throw Error(name + " has dtype " + dtype_name(t) +
                " but posembed's kernels take float32, bfloat16 or float16" + fix);
  }
  check_layout(a, name, ndim);
  if (f16) return as(fp16{});
  return as(bf16{});
}

template <bool kConst>
std::span<const std::byte> bytes_of(const BasicTensorSpan<kConst>& t) {
  return {static_cast<const std::byte*>(t.data), t.size * dtype_bytes(t.dtype)};
}

template <class T>
std::span<T> view_optional(const std::optional<Out>& a, const std::string& name, std::size_t ndim) {
  return a ? view<T>(*a, name, ndim) : std::span<T>{};
}

template <class Array>
std::int64_t dim(const Array& a, std::size_t i) {
  return static_cast<std::int64_t>(a.shape(i));
}

inline void require_shape(const std::string& name, const std::string& actual, std::int64_t got0,
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

}  // namespace posembed::python
