#include <gtest/gtest.h>

#include <source_location>
#include <string>
#include <vector>

#include "core/test_util.h"
#include "posembed/core/embedding.h"
#include "posembed/core/error.h"
#include "posembed/core/position_ids.h"

namespace posembed {
namespace {

using Ids = std::vector<std::int64_t>;

// An output of n ids that no scheme writes (all negative), to show a partial write.
Ids sentinel(std::size_t n) {
  return Ids(n, -7);
}

// Each rejected call below must leave `out` as it was (position_ids.h's promise).
template <class Call>
void rejected(Ids& out, Call&& call, std::source_location where = std::source_location::current()) {
  test::expect_rejected_untouched<std::int64_t>({&out}, call, where);
}

TEST(PositionIds, ContiguousFromTheCachedLength) {
  Ids out(6);
  positions_contiguous(out, 2, 3, 5);
  EXPECT_EQ(out, (Ids{5, 6, 7, 5, 6, 7}));
  out = sentinel(6);
  rejected(out, [&] { positions_contiguous(out, 2, 3, -1); });
  rejected(out, [&] { positions_contiguous(out, 2, 4, 0); });
}

TEST(PositionIds, LeftPaddingFollowsHuggingFaceGenerate) {
  // cumsum(mask) - 1 with padded slots at 1, written out by hand.
  const Ids mask{0, 0, 1, 1, 1,
                 1, 1, 1, 1, 1};
  Ids out(10);
  positions_from_attention_mask(out, mask, 2, 5, 5);
  EXPECT_EQ(out, (Ids{1, 1, 0, 1, 2, 0, 1, 2, 3, 4}));
  // Decoding with a cache: the mask covers 5 cached + 1 new token; keep the last column.
  const Ids mask6{0, 0, 1, 1, 1, 1,
                  1, 1, 1, 1, 1, 1};
  Ids last(2);
  positions_from_attention_mask(last, mask6, 2, 6, 1);
  EXPECT_EQ(last, (Ids{3, 5}));
}

TEST(PositionIds, LeftPaddedRowEmbedsLikeTheUnpaddedText) {
  const std::int64_t d = 6, V = 20, P = 16;
  const auto tok = test::random_floats(V * d, 1), pos = test::random_floats(P * d, 2);
  const Ids text{3, 14, 15, 9, 2};
  Ids text_pos(5);
  positions_contiguous(text_pos, 1, 5, 0);
  std::vector<float> plain(5 * d);
  embedding_forward(plain, text, text_pos, tok, pos, {1, 5, V, P, d}, {});

  const Ids padded{0, 0, 0, 3, 14, 15, 9, 2};  // pad id 0, left padded to 8
  const Ids mask{0, 0, 0, 1, 1, 1, 1, 1};
  Ids padded_pos(8);
  positions_from_attention_mask(padded_pos, mask, 1, 8, 8);
  std::vector<float> out(8 * d);
  embedding_forward(out, padded, padded_pos, tok, pos, {1, 8, V, P, d}, {});
  EXPECT_TRUE(std::equal(plain.begin(), plain.end(), out.begin() + 3 * d));

  // The naive arange would shift every real token by the padding: a silent bug.
  Ids naive(8);
  positions_contiguous(naive, 1, 8, 0);
  embedding_forward(out, padded, naive, tok, pos, {1, 8, V, P, d}, {});
  EXPECT_FALSE(std::equal(plain.begin(), plain.end(), out.begin() + 3 * d));
}

TEST(PositionIds, ShapesWhoseSizesOverflowAreErrors) {
  // 2^32 x 2^32 wraps to 0: without a checked product, empty buffers would pass.
  const std::int64_t huge = std::int64_t{1} << 32;
  Ids empty;
  EXPECT_THROW(positions_from_eos(empty, empty, huge, huge, 0), Error);
  EXPECT_THROW(positions_fairseq(empty, empty, huge, huge, 1), Error);
  EXPECT_THROW(positions_from_attention_mask(empty, empty, huge, huge, huge), Error);
}

TEST(PositionIds, MaskErrors) {
  Ids out = sentinel(3);
  rejected(out, [&] { positions_from_attention_mask(out, Ids{1, 2, 1}, 1, 3, 3); });  // not 0/1
  rejected(out, [&] { positions_from_attention_mask(out, Ids{1, 1}, 1, 2, 3); });     // too short
  rejected(out, [&] { positions_from_attention_mask(out, Ids{1, 1, 1, 1}, 1, 3, 3); });  // bad size
  // The bad value in the last row, after a valid one: nothing of row 0 is written either.
  Ids two_rows = sentinel(6);
  for (const Ids& mask : {Ids{1, 1, 1, 0, 1, 3}, Ids{0, 1, 1, 1, 1, -1}}) {
    rejected(two_rows, [&] { positions_from_attention_mask(two_rows, mask, 2, 3, 3); });
    rejected(two_rows, [&] { positions_opt(two_rows, mask, 2, 3, 3); });
  }
  rejected(two_rows, [&] { positions_opt(two_rows, Ids{1, 1, 1, 1}, 2, 2, 3); });  // too short
}

TEST(PositionIds, TokenShapeErrorsLeaveTheOutputUntouched) {
  Ids out = sentinel(6);
  const Ids five{1, 2, 0, 3, 4};  // one token short of (2, 3)
  rejected(out, [&] { positions_from_eos(out, five, 2, 3, 0); });
  rejected(out, [&] { positions_fairseq(out, five, 2, 3, 1); });
  Ids seven = sentinel(7);  // output of the wrong size
  rejected(seven, [&] { positions_from_eos(seven, Ids{1, 2, 0, 3, 4, 5}, 2, 3, 0); });
  rejected(seven, [&] { positions_fairseq(seven, Ids{1, 2, 0, 3, 4, 5}, 2, 3, 1); });
  rejected(seven, [&] { positions_contiguous(seven, 2, 3, 0); });
}

TEST(PositionIds, PackedByCumulativeLengths) {
  Ids out(8);
  positions_from_cu_seqlens(out, Ids{0, 3, 4, 4, 8});  // lengths 3, 1, 0, 4
  EXPECT_EQ(out, (Ids{0, 1, 2, 0, 0, 1, 2, 3}));
  out = sentinel(8);
  // A decrease after a valid first document: that document must not be written.
  rejected(out, [&] { positions_from_cu_seqlens(out, Ids{0, 3, 2, 8}); });
  rejected(out, [&] { positions_from_cu_seqlens(out, Ids{0, 3, 5, 4, 8}); });
  rejected(out, [&] { positions_from_cu_seqlens(out, Ids{0, 7}); });
  rejected(out, [&] { positions_from_cu_seqlens(out, Ids{1, 8}); });
  rejected(out, [&] { positions_from_cu_seqlens(out, Ids{}); });
}

TEST(PositionIds, PackedByEndOfDocumentRestartsAfterOneTokenDocuments) {
  const std::int64_t eos = 0;
  // Documents: [5 6 0] [0] [0] [7 8] | new row: [0] [9 9]
  const Ids tokens{5, 6, 0, 0, 0, 7, 8,
                   0, 9, 9, 1, 2, 3, 4};
  Ids out(14);
  positions_from_eos(out, tokens, 2, 7, eos);
  EXPECT_EQ(out, (Ids{0, 1, 2, 0, 0, 0, 1,
                      0, 0, 1, 2, 3, 4, 5}));
}

TEST(PositionIds, OptAndFairseqTableRows) {
  const Ids mask{0, 1, 1, 1};
  Ids opt(4);
  positions_opt(opt, mask, 1, 4, 4);
  EXPECT_EQ(opt, (Ids{1, 2, 3, 4}));  // padding on row 1, real tokens from row 2
  const Ids tokens{1, 1, 5, 6};        // pad id 1
  Ids fairseq(4);
  positions_fairseq(fairseq, tokens, 1, 4, 1);
  EXPECT_EQ(fairseq, (Ids{1, 1, 2, 3}));
}

}  // namespace
}  // namespace posembed
