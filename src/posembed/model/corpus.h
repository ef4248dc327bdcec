// The text a model trains and is evaluated on: read from files, split into
// train and validation bytes, and cut into windows of T bytes (inputs) each
// with its next byte (targets). Training windows start at random offsets keyed
// by (seed, step, row); evaluation windows are consecutive, picked by
// consecutive_windows for the trainer, `posembed eval` and the experiments alike.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

namespace posembed::model {

// The text, split into train and validation bytes.
struct Corpus {
  std::vector<std::uint8_t> train, val;
  double unigram_entropy = 0;  // nats per byte, over the whole text
  std::uint64_t total_bytes = 0;
};
// path: a file, or a directory whose regular files (not symlinks, not *.dat
// index files) are concatenated in name order: the fortunes package's layout.
std::vector<std::uint8_t> read_text(const std::filesystem::path& path);
// Interleaved 4 KiB chunks, val_fraction of them held out, spread evenly so
// both splits cover every part of the text.
Corpus split_corpus(std::vector<std::uint8_t> text, double val_fraction);

// Training windows of batch rows first_row .. first_row + B - 1 at `step`: row
// r starts at a random offset in `text` keyed by (seed, step, r).
void fill_train_batch(std::span<std::int64_t> inputs, std::span<std::int64_t> targets,
                      std::span<const std::uint8_t> text, std::int64_t B, std::int64_t T,
                      std::uint64_t seed, std::uint64_t step, std::int64_t first_row = 0);

// Start offsets of the consecutive windows of T bytes of a text of `size` bytes
// (0, T, 2T, ...; each needs T + 1 bytes: inputs and next-byte targets; none is
// truncated away, every byte but the last is some window's input).
// max_windows > 0 keeps that many, evenly spread.
std::vector<std::int64_t> consecutive_windows(std::size_t size, std::int64_t T,
                                              std::int64_t max_windows = 0);

// The windows at `starts` (at least one) into the rows of inputs and targets
// ((rows, T) each); rows past the last window repeat it (a last, short batch).
void fill_windows(std::span<std::int64_t> inputs, std::span<std::int64_t> targets,
                  std::span<const std::uint8_t> text, std::span<const std::int64_t> starts,
                  std::int64_t T);

}  // namespace posembed::model
