#include <gtest/gtest.h>
#include "posembed/core/config.h"
TEST(Config, Defaults) { EXPECT_EQ(posembed::EmbeddingConfig{}.max_seq_len, 1024); }
