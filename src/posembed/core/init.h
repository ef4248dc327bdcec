// Reproducible initialisation. Element i of a table is a pure function of
// (seed, stream, i): any machine and any thread count give the same bits.
//
// The standard normal for element i comes from one Philox block (counter
// block = i, step = attempt): u1 = (w0:w1 >> 11 + 1) / 2^53 in (0, 1],
// u2 = (w2:w3 >> 11) / 2^53 in [0, 1), z = sqrt(-2 ln u1) cos(2 pi u2), all in
// double, then multiplied by std and rounded once to float. trunc_normal redraws
// with attempt = 1, 2, ... until |z| <= 2.
#pragma once

#include <cstdint>
#include <span>

#include "posembed/core/config.h"
#include "posembed/core/philox.h"

namespace posembed {

double standard_normal(std::uint64_t seed, RandomStream stream, std::uint64_t index,
                       std::uint64_t attempt = 0);

// table: (rows, embed_dim), filled with init. first_index is the flat index of
// table[0] within its stream, so a table filled in pieces gets the same values as
// one filled at once. resize grows a table by drawing its new rows from
// RandomStream::resize_init at their flat index: deterministic for a seed, but not
// the values a table created at the larger size (position_init) would hold.
void init_table(std::span<float> table, const TableInit& init, std::int64_t embed_dim,
                std::uint64_t seed, RandomStream stream, std::uint64_t first_index = 0);

}  // namespace posembed
