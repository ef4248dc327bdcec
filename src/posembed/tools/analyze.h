// `posembed analyze`: how many dimensions a position table really uses and how
// smoothly it varies along the positions.
//
// On a (rows, cols) table X (row p = position p):
//   spectrum     singular values s_1 >= s_2 >= ... of the mean-centred table
//                X - 1 mean(X) (Eigen BDCSVD in double); the variance carried by
//                component i is s_i^2 / sum_j s_j^2
//   components   the fewest leading components that carry >= 90/95/99% of it
//   participation ratio  (sum s_i^2)^2 / sum s_i^4: n for n equal components
//   gap rank     k < min(rows - 1, cols) maximising s_k / s_(k+1): the rank
//                estimate for a low-rank table plus noise; values below
//                s_1 * max(rows, cols) * eps_f32 count as that floor, so the
//                exact zeros past an exact rank make one gap, not noisy ratios
//   norms        ||X[p]|| per position (not centred)
//   neighbours   cos(X[p], X[p+1]) (not centred; 0 where a row is all zeros)
//   heatmap      cos(X[p], X[q]) for all p, q (subsampled above 1024 positions)
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace posembed::tools {

struct TableAnalysis {
  std::int64_t rows = 0, cols = 0;
  std::vector<double> singular_values;  // (min(rows, cols),) descending
  std::vector<double> variance_ratio;   // (min(rows, cols),) s_i^2 / sum s^2
  std::int64_t components_90 = 0, components_95 = 0, components_99 = 0;
  double participation_ratio = 0;
  std::int64_t gap_rank = 0;             // components before the largest spectral gap
  double gap_ratio = 0;                  // s_k / s_(k+1) at that gap
  double mean_row_norm = 0;              // norm of the mean row, the part centring removes
  std::vector<double> row_norms;         // (rows,)
  std::vector<double> neighbour_cosine;  // (rows - 1,) cos(row p, row p + 1)
  std::int64_t zero_rows = 0;            // rows whose norm is 0
};

// table: (rows, cols) row-major. Throws posembed::Error on a shape that does not
// match the data, rows < 2, or a non-finite value (naming its position).
TableAnalysis analyze_table(std::span<const float> table, std::int64_t rows, std::int64_t cols);

// Fewest leading components whose variance_ratio sums to >= level (level in (0, 1]).
std::int64_t components_for(std::span<const double> variance_ratio, double level);

// Cosine similarity of every pair of the positions 0, stride, 2 stride, ...:
// (n, n) row-major with n = ceil(rows / stride); 0 where a row is all zeros.
std::vector<float> cosine_matrix(std::span<const float> table, std::int64_t rows, std::int64_t cols,
                                 std::int64_t stride = 1);

// Text summary and JSON ("format": "posembed-analyze", "version": 1). `source`
// names the file and tensor.
std::string format_analysis(const TableAnalysis& a, const std::string& source);
std::string analysis_json(const TableAnalysis& a, const std::string& source);

}  // namespace posembed::tools
