// The fuzzer's seed corpus (tests/fuzz/corpus, written by tests/fuzz/make_seeds.py)
// replayed through the normal build: valid_* and empty_object parse, bad_* throw
// posembed::Error. Guards the corpus itself and runs under the sanitizer build.
#include <filesystem>

#include <gtest/gtest.h>

#include "io/io_test_util.h"
#include "posembed/core/error.h"
#include "posembed/io/safetensors.h"

namespace posembed::io {
namespace {

TEST(FuzzCorpus, ValidSeedsParseAndBadSeedsThrow) {
  std::size_t valid = 0, bad = 0;
  for (const auto& entry : std::filesystem::directory_iterator(POSEMBED_FUZZ_CORPUS)) {
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    if (name.starts_with("bad_")) {
      EXPECT_THROW(SafetensorsFile::open(entry.path()), Error);
      ++bad;
    } else {
      const auto file = SafetensorsFile::open(entry.path());
      for (const auto& t : file.tensors()) EXPECT_EQ(static_cast<std::int64_t>(file.to_f32(t).size()), t.numel());
      ++valid;
    }
  }
  EXPECT_GE(valid, 15u);
  EXPECT_GE(bad, 10u);
}

}  // namespace
}  // namespace posembed::io
