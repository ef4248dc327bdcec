#include "posembed/core/position_ids.h"

#include <string>

#include "posembed/core/error.h"

namespace posembed {
namespace {

void check_shape(std::string_view what, std::size_t actual, std::int64_t rows, std::int64_t cols) {
  if (rows < 0 || cols < 0) {
    throw Error(std::string(what) + ": negative shape (" + std::to_string(rows) + ", " +
                std::to_string(cols) + ")");
  }
  const std::uint64_t needed = checked_product(static_cast<std::uint64_t>(rows),
                                               static_cast<std::uint64_t>(cols), what);
  if (actual != needed) {
    throw Error(std::string(what) + " holds " + std::to_string(actual) +
                " values but the shape (" + std::to_string(rows) + ", " + std::to_string(cols) +
                ") needs " + std::to_string(needed));
  }
}

void check_mask(std::span<const std::int64_t> mask, std::int64_t batch, std::int64_t mask_len,
                std::int64_t seq_len) {
  check_shape("attention_mask", mask.size(), batch, mask_len);
  if (seq_len > mask_len) {
    throw Error("seq_len " + std::to_string(seq_len) + " exceeds the attention mask's length " +
                std::to_string(mask_len) +
                "; the mask must cover the cached and the new tokens");
  }
  for (std::size_t i = 0; i < mask.size(); ++i) {
    if (mask[i] != 0 && mask[i] != 1) {
      throw Error("attention_mask[" + std::to_string(i / static_cast<std::size_t>(mask_len)) +
                  "][" + std::to_string(i % static_cast<std::size_t>(mask_len)) + "] = " +
                  std::to_string(mask[i]) + "; a mask holds only 0 (padding) and 1 (token)");
    }
  }
}

// Shared by HF and OPT: running count of real tokens, last seq_len columns.
template <class Emit>
void masked_cumsum(std::span<std::int64_t> out, std::span<const std::int64_t> mask,
                   std::int64_t batch, std::int64_t mask_len, std::int64_t seq_len, Emit emit) {
  check_mask(mask, batch, mask_len, seq_len);
  check_shape("position ids", out.size(), batch, seq_len);
  for (std::int64_t b = 0; b < batch; ++b) {
    std::int64_t count = 0;
    for (std::int64_t t = 0; t < mask_len; ++t) {
      const std::int64_t m = mask[static_cast<std::size_t>(b * mask_len + t)];
      count += m;
      const std::int64_t column = t - (mask_len - seq_len);
      if (column >= 0) out[static_cast<std::size_t>(b * seq_len + column)] = emit(count, m);
    }
  }
}

}  // namespace

void positions_contiguous(std::span<std::int64_t> out, std::int64_t batch, std::int64_t seq_len,
                          std::int64_t offset) {
  check_shape("position ids", out.size(), batch, seq_len);
  if (offset < 0) {
    throw Error("position offset " + std::to_string(offset) +
                " is negative; it is the number of tokens already in the KV cache");
  }
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t t = 0; t < seq_len; ++t) out[static_cast<std::size_t>(b * seq_len + t)] = offset + t;
  }
}

void positions_from_attention_mask(std::span<std::int64_t> out,
                                   std::span<const std::int64_t> attention_mask,
                                   std::int64_t batch, std::int64_t mask_len,
                                   std::int64_t seq_len) {
  masked_cumsum(out, attention_mask, batch, mask_len, seq_len,
                [](std::int64_t count, std::int64_t m) { return m ? count - 1 : 1; });
}

void positions_opt(std::span<std::int64_t> out, std::span<const std::int64_t> attention_mask,
                   std::int64_t batch, std::int64_t mask_len, std::int64_t seq_len) {
  constexpr std::int64_t kOptOffset = 2;
  masked_cumsum(out, attention_mask, batch, mask_len, seq_len,
                [](std::int64_t count, std::int64_t m) { return count * m - 1 + kOptOffset; });
}

void positions_from_cu_seqlens(std::span<std::int64_t> out,
                               std::span<const std::int64_t> cu_seqlens) {
  const auto n = static_cast<std::int64_t>(out.size());
  if (cu_seqlens.empty() || cu_seqlens.front() != 0 || cu_seqlens.back() != n) {
    throw Error("cu_seqlens must start at 0 and end at the token count " + std::to_string(n) +
                (cu_seqlens.empty() ? std::string("; it is empty")
                                    : "; it runs from " + std::to_string(cu_seqlens.front()) +
                                          " to " + std::to_string(cu_seqlens.back())));
  }
  for (std::size_t k = 1; k < cu_seqlens.size(); ++k) {
    if (cu_seqlens[k] < cu_seqlens[k - 1]) {
      throw Error("cu_seqlens[" + std::to_string(k) + "] = " + std::to_string(cu_seqlens[k]) +
                  " is below cu_seqlens[" + std::to_string(k - 1) + "] = " +
                  std::to_string(cu_seqlens[k - 1]) + "; offsets must not decrease");
    }
  }
  for (std::size_t k = 0; k + 1 < cu_seqlens.size(); ++k) {
    for (std::int64_t i = cu_seqlens[k]; i < cu_seqlens[k + 1]; ++i) {
      out[static_cast<std::size_t>(i)] = i - cu_seqlens[k];
    }
  }
}

void positions_from_eos(std::span<std::int64_t> out, std::span<const std::int64_t> input_ids,
                        std::int64_t batch, std::int64_t seq_len, std::int64_t eos_id) {
  check_shape("token ids", input_ids.size(), batch, seq_len);
  check_shape("position ids", out.size(), batch, seq_len);
  for (std::int64_t b = 0; b < batch; ++b) {
    std::int64_t position = 0;
    for (std::int64_t t = 0; t < seq_len; ++t) {
      const auto i = static_cast<std::size_t>(b * seq_len + t);
      out[i] = position++;
      if (input_ids[i] == eos_id) position = 0;  // the eos ends its document
    }
  }
}

void positions_fairseq(std::span<std::int64_t> out, std::span<const std::int64_t> input_ids,
                       std::int64_t batch, std::int64_t seq_len, std::int64_t pad_id) {
  check_shape("token ids", input_ids.size(), batch, seq_len);
  check_shape("position ids", out.size(), batch, seq_len);
  for (std::int64_t b = 0; b < batch; ++b) {
    std::int64_t count = 0;
    for (std::int64_t t = 0; t < seq_len; ++t) {
      const auto i = static_cast<std::size_t>(b * seq_len + t);
      const std::int64_t real = input_ids[i] != pad_id;
      count += real;
      out[i] = count * real + pad_id;
    }
  }
}

}  // namespace posembed
