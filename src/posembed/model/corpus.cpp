#include "posembed/model/corpus.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <iterator>
#include <string>

#include "posembed/core/error.h"
#include "posembed/core/layer.h"
#include "posembed/core/philox.h"
#include "posembed/core/sizes.h"

namespace posembed::model {
namespace {


constexpr std::size_t kChunkBytes = 4096;  // granularity of the train/validation split

// One window: T input bytes from `start` and the byte after each.
void copy_window(std::int64_t* inputs, std::int64_t* targets, std::span<const std::uint8_t> text,
                 std::size_t start, std::int64_t T) {
  for (std::int64_t t = 0; t < T; ++t) {
    inputs[t] = text[start + sz(t)];
    targets[t] = text[start + sz(t) + 1];
  }
}

}  // namespace

std::vector<std::uint8_t> read_text(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw Error("training data " + path.string() +
                " not found; install the Debian package "
                "'fortunes' (scripts/deps.sh run) for the default corpus, or pass --data FILE");
  }
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    for (const auto& entry : fs::directory_iterator(path)) {
      if (entry.is_symlink() || !entry.is_regular_file()) continue;
      if (entry.path().extension() == ".dat") continue;  // strfile's binary index
      files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
  } else if (fs::is_regular_file(path)) {
    files.push_back(path);
  } else {  // a FIFO would block the read forever, /dev/zero never end
    throw Error("training data " + path.string() +
                " is neither a regular file nor a directory (a FIFO or a device?); pass a text "
                "file or a folder of them with --data");
  }
  std::uintmax_t total = 0;
  for (const auto& f : files) total += fs::file_size(f);
  check_fits_in_memory(total,
                       "the text at " + path.string() + " holds " + std::to_string(total) +
                           " bytes, which are read into memory,",
                       "use less text (--data)");
  std::vector<std::uint8_t> text;
  text.reserve(total);
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw Error("cannot read " + f.string());
    text.insert(text.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return text;
}

Corpus split_corpus(std::vector<std::uint8_t> text, double val_fraction) {
  Corpus c;
  c.total_bytes = text.size();
  std::array<std::uint64_t, 256> counts{};
  for (auto b : text) ++counts[b];
  for (auto n : counts) {
    if (n == 0) continue;
    const double p = static_cast<double>(n) / static_cast<double>(text.size());
    c.unigram_entropy -= p * std::log(p);
  }
  // Chunk k goes to validation when floor((k+1) f) > floor(k f): an even spread,
  // so both splits see every part (every fortune file) of the text.
  for (std::size_t k = 0, at = 0; at < text.size(); ++k, at += kChunkBytes) {
    const auto end = std::min(text.size(), at + kChunkBytes);
    const bool val = std::floor(static_cast<double>(k + 1) * val_fraction) >
                     std::floor(static_cast<double>(k) * val_fraction);
    auto& dst = val ? c.val : c.train;
    dst.insert(dst.end(), text.begin() + static_cast<std::ptrdiff_t>(at),
               text.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return c;
}

void fill_train_batch(std::span<std::int64_t> inputs, std::span<std::int64_t> targets,
                      std::span<const std::uint8_t> text, std::int64_t B, std::int64_t T,
                      std::uint64_t seed, std::uint64_t step, std::int64_t first_row) {
  const std::uint64_t range = text.size() - static_cast<std::uint64_t>(T);  // offsets [0, range)
  for (std::int64_t b = 0; b < B; ++b) {
    const PhiloxCounter w = philox4x32_10(philox_counter(static_cast<std::uint64_t>(first_row + b),
                                                         step, RandomStream::data_sampling),
                                          philox_key(seed));
    const std::uint64_t offset = ((std::uint64_t{w[0]} << 32) | w[1]) % range;
    copy_window(inputs.data() + b * T, targets.data() + b * T, text, offset, T);
  }
}

std::vector<std::int64_t> consecutive_windows(std::size_t size, std::int64_t T,
                                              std::int64_t max_windows) {
  if (T < 1) throw Error("window length " + std::to_string(T) + " must be >= 1");
  std::vector<std::int64_t> all;
  for (std::int64_t s = 0; sz(s + T) + 1 <= size; s += T) all.push_back(s);
  const auto n = static_cast<std::int64_t>(all.size());
  if (max_windows <= 0 || max_windows >= n) return all;
  std::vector<std::int64_t> some(sz(max_windows));
  for (std::int64_t i = 0; i < max_windows; ++i) some[sz(i)] = all[sz(i * n / max_windows)];
  return some;
}

void fill_windows(std::span<std::int64_t> inputs, std::span<std::int64_t> targets,
                  std::span<const std::uint8_t> text, std::span<const std::int64_t> starts,
                  std::int64_t T) {
  const auto rows = static_cast<std::int64_t>(inputs.size()) / T;
  const auto last = static_cast<std::int64_t>(starts.size()) - 1;
  for (std::int64_t b = 0; b < rows; ++b) {
    copy_window(inputs.data() + b * T, targets.data() + b * T, text,
                sz(starts[sz(std::min(b, last))]), T);
  }
}

}  // namespace posembed::model
