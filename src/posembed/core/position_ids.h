// Position-id schemes of the systems our users run. Each writes a (B, T) or
// (N) array of row indices into the position table; the forward pass checks
// them against max_seq_len. Inputs are validated first; on error the output
// is untouched.
#pragma once

#include <cstdint>
#include <span>

namespace posembed {

// (a) offset, offset+1, ..., offset+T-1 in every row. With a KV cache the
// offset is the number of tokens already cached (Hugging Face GPT-2's default).
// out: (B, T)
void positions_contiguous(std::span<std::int64_t> out, std::int64_t batch, std::int64_t seq_len,
                          std::int64_t offset = 0);

// (c) Left padding, as Hugging Face generate(): pos = cumsum(mask) - 1 with
// padded slots set to 1, then the last T columns (T < mask_len when decoding
// with a cache, the mask covering cached plus new tokens). A left-padded row
// then embeds its real tokens exactly as the same text unpadded.
// out: (B, T); attention_mask: (B, mask_len) of 0 and 1
void positions_from_attention_mask(std::span<std::int64_t> out,
                                   std::span<const std::int64_t> attention_mask,
                                   std::int64_t batch, std::int64_t mask_len,
                                   std::int64_t seq_len);

// (d) Packed documents given cumulative lengths (the varlen convention):
// document k covers tokens [cu_seqlens[k], cu_seqlens[k+1]); positions restart
// at 0 at each start. cu_seqlens[0] == 0, non-decreasing, last == out.size().
// out: (N)
void positions_from_cu_seqlens(std::span<std::int64_t> out,
                               std::span<const std::int64_t> cu_seqlens);

// (d) Packed documents split by an end-of-document token (Megatron's
// reset_position_ids): the token after each eos_id starts at 0, and so does
// every row. A one-token document (eos right after eos) restarts correctly.
// out: (B, T); input_ids: (B, T)
void positions_from_eos(std::span<std::int64_t> out, std::span<const std::int64_t> input_ids,
                        std::int64_t batch, std::int64_t seq_len, std::int64_t eos_id);

// OPT's table rows: pos = cumsum(mask) * mask - 1, last T columns, plus the
// table's offset of 2 (padding lands on row 1). out: (B, T); mask: (B, mask_len)
void positions_opt(std::span<std::int64_t> out, std::span<const std::int64_t> attention_mask,
                   std::int64_t batch, std::int64_t mask_len, std::int64_t seq_len);

// fairseq / RoBERTa table rows: m = token != pad; pos = cumsum(m) * m + pad
// (padding lands on row pad, real tokens start at pad + 1). out, input_ids: (B, T)
void positions_fairseq(std::span<std::int64_t> out, std::span<const std::int64_t> input_ids,
                       std::int64_t batch, std::int64_t seq_len, std::int64_t pad_id);

}  // namespace posembed
