// The plots of `posembed analyze`, PNG or SVG by the file's extension (see plot.h).
// Apart from analyze.h because they need cairo, which the analysis itself (and so the
// Python package) does not.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "posembed/tools/analyze.h"

namespace posembed::tools {

// The cosine heatmap with a colour scale from -1 (blue) through 0 (white) to +1
// (red), and the singular-value spectrum (log scale) above the cumulative
// variance with the 90/95/99% marks.
// The heatmap draws at most max_positions positions (every stride-th above it).
void write_table_heatmap(const std::filesystem::path& path, std::span<const float> table,
                         std::int64_t rows, std::int64_t cols, const std::string& title,
                         std::int64_t max_positions = 1024);
void write_spectrum_plot(const std::filesystem::path& path, const TableAnalysis& analysis,
                         const std::string& title);

}  // namespace posembed::tools
