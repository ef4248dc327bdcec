// Eigen's own OpenMP parallelism is switched off so that results cannot depend
// on the thread count; the tables analysed here are small (<= 8192 x 1600).
#define EIGEN_DONT_PARALLELIZE
#include "posembed/tools/analyze.h"

#include <Eigen/Dense>
#include <Eigen/SVD>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "posembed/core/error.h"
#include "posembed/tools/format.h"

namespace posembed::tools {
namespace {

using RowMajorF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

void check_table(std::span<const float> table, std::int64_t rows, std::int64_t cols,
                 std::int64_t min_rows) {
  if (rows < min_rows || cols < 1) {
    throw Error("position table of " + std::to_string(rows) + " x " + std::to_string(cols) +
                ": analyze needs at least " + std::to_string(min_rows) +
                " rows and 1 column (is it a 2-D table?)");
  }
  if (static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(cols) != table.size()) {
    throw Error("table data holds " + std::to_string(table.size()) + " values, not " +
                std::to_string(rows) + " x " + std::to_string(cols));
  }
  for (std::size_t i = 0; i < table.size(); ++i) {
    if (!std::isfinite(table[i])) {
      throw Error("table value at position " + std::to_string(i / static_cast<std::size_t>(cols)) +
                  ", column " + std::to_string(i % static_cast<std::size_t>(cols)) + " is " +
                  std::to_string(table[i]) + "; analyze needs finite values");
    }
  }
}

Eigen::Map<const RowMajorF> as_matrix(std::span<const float> table, std::int64_t rows,
                                      std::int64_t cols) {
  return Eigen::Map<const RowMajorF>(table.data(), rows, cols);
}

}  // namespace

std::int64_t components_for(std::span<const double> variance_ratio, double level) {
  if (!(level > 0 && level <= 1)) {
    throw Error("variance level " + std::to_string(level) + " must lie in (0, 1]");
  }
  double sum = 0;
  for (std::size_t i = 0; i < variance_ratio.size(); ++i) {
    sum += variance_ratio[i];
    // A relative slack of 1e-12 so that level 1 is reached despite rounding in the sum.
    if (sum >= level * (1 - 1e-12)) return static_cast<std::int64_t>(i + 1);
  }
  return static_cast<std::int64_t>(variance_ratio.size());
}

TableAnalysis analyze_table(std::span<const float> table, std::int64_t rows, std::int64_t cols) {
  check_table(table, rows, cols, 2);
  TableAnalysis a;
  a.rows = rows;
  a.cols = cols;
  const auto n = static_cast<std::size_t>(rows), d = static_cast<std::size_t>(cols);

  // Mean-centred table in double; its singular values are the spectrum.
  const Eigen::MatrixXd x = as_matrix(table, rows, cols).cast<double>();  // (rows, cols)
  const Eigen::RowVectorXd mean = x.colwise().mean();                     // (cols,)
  const Eigen::MatrixXd centred = x.rowwise() - mean;                     // (rows, cols)
  a.mean_row_norm = mean.norm();
  const Eigen::BDCSVD<Eigen::MatrixXd> svd(centred);  // values only
  const Eigen::VectorXd& s = svd.singularValues();
  a.singular_values.assign(s.data(), s.data() + s.size());

  double total = 0, total_sq = 0;
  for (double v : a.singular_values) {
    total += v * v;
    total_sq += v * v * v * v;
  }
  a.variance_ratio.resize(a.singular_values.size(), 0.0);
  if (total > 0) {
    for (std::size_t i = 0; i < a.singular_values.size(); ++i) {
      a.variance_ratio[i] = a.singular_values[i] * a.singular_values[i] / total;
    }
    a.components_90 = components_for(a.variance_ratio, 0.90);
    a.components_95 = components_for(a.variance_ratio, 0.95);
    a.components_99 = components_for(a.variance_ratio, 0.99);
    a.participation_ratio = total * total / total_sq;

    // Largest gap s_k / s_(k+1) over the dimensions centring leaves (at most
    // rows - 1), with values below the float32 noise floor raised to it so that
    // the exact zeros past an exact rank make one gap, not a run of noisy ratios.
    const double floor_value = a.singular_values[0] * static_cast<double>(std::max(n, d)) *
                               static_cast<double>(FLT_EPSILON);
    const std::size_t usable = std::min(n - 1, d);
    for (std::size_t k = 1; k < usable; ++k) {
      const double ratio = std::max(a.singular_values[k - 1], floor_value) /
                           std::max(a.singular_values[k], floor_value);
      if (ratio > a.gap_ratio) {
        a.gap_ratio = ratio;
        a.gap_rank = static_cast<std::int64_t>(k);
      }
    }
  }

  // Per-position norms and neighbour cosines of the raw table, in double.
  a.row_norms.resize(n);
  for (std::size_t p = 0; p < n; ++p) {
    double sum = 0;
    for (std::size_t j = 0; j < d; ++j)
      sum += static_cast<double>(table[p * d + j]) * table[p * d + j];
    a.row_norms[p] = std::sqrt(sum);
    a.zero_rows += a.row_norms[p] == 0;
  }
  a.neighbour_cosine.resize(n - 1);
  for (std::size_t p = 0; p + 1 < n; ++p) {
    double dot = 0;
    for (std::size_t j = 0; j < d; ++j) {
      dot += static_cast<double>(table[p * d + j]) * table[(p + 1) * d + j];
    }
    const double denom = a.row_norms[p] * a.row_norms[p + 1];
    a.neighbour_cosine[p] = denom > 0 ? dot / denom : 0.0;
  }
  return a;
}

std::vector<float> cosine_matrix(std::span<const float> table, std::int64_t rows, std::int64_t cols,
                                 std::int64_t stride) {
  check_table(table, rows, cols, 1);
  if (stride < 1) throw Error("cosine_matrix: stride " + std::to_string(stride) + " must be >= 1");
  const std::int64_t count = (rows + stride - 1) / stride;
  Eigen::MatrixXd unit(count, cols);  // (count, cols) selected rows scaled to norm 1
  const auto x = as_matrix(table, rows, cols);
  for (std::int64_t i = 0; i < count; ++i) {
    const Eigen::RowVectorXd row = x.row(i * stride).cast<double>();
    const double norm = row.norm();
    unit.row(i) = norm > 0 ? Eigen::RowVectorXd(row / norm) : Eigen::RowVectorXd::Zero(cols);
  }
  const Eigen::MatrixXd gram = unit * unit.transpose();  // (count, count)
  std::vector<float> out(static_cast<std::size_t>(count * count));
  for (std::int64_t i = 0; i < count; ++i) {
    for (std::int64_t j = 0; j < count; ++j) {
      out[static_cast<std::size_t>(i * count + j)] = static_cast<float>(gram(i, j));
    }
  }
  return out;
}

std::string format_analysis(const TableAnalysis& a, const std::string& source) {
  std::string out = format("posembed analyze: %s (%lld positions x %lld dims)\n", source.c_str(),
                           static_cast<long long>(a.rows), static_cast<long long>(a.cols));
  const std::size_t k = a.singular_values.size();
  out += format("  spectrum of the mean-centred table (%zu singular values):\n    s =", k);
  for (std::size_t i = 0; i < std::min<std::size_t>(k, 8); ++i) {
    out += format(" %.4g", a.singular_values[i]);
  }
  out += k > 8 ? " ...\n" : "\n";
  out += "    variance % =";
  for (std::size_t i = 0; i < std::min<std::size_t>(k, 8); ++i) {
    out += format(" %.2f", 100 * a.variance_ratio[i]);
  }
  out += k > 8 ? " ...\n" : "\n";
  out +=
      format("  components for 90%% / 95%% / 99%% of the variance: %lld / %lld / %lld (of %zu)\n",
             static_cast<long long>(a.components_90), static_cast<long long>(a.components_95),
             static_cast<long long>(a.components_99), k);
  out += format("  participation ratio: %.2f\n", a.participation_ratio);
  out += format("  largest spectral gap: after %lld components (s_k / s_k+1 = %.3g)\n",
                static_cast<long long>(a.gap_rank), a.gap_ratio);
  const auto [min_it, max_it] = std::minmax_element(a.row_norms.begin(), a.row_norms.end());
  double mean_norm = 0;
  for (double v : a.row_norms) mean_norm += v;
  mean_norm /= static_cast<double>(a.row_norms.size());
  out += format(
      "  per-position norm: mean %.4g, min %.4g (position %td), max %.4g (position %td); "
      "norm of the mean row %.4g\n",
      mean_norm, *min_it, min_it - a.row_norms.begin(), *max_it, max_it - a.row_norms.begin(),
      a.mean_row_norm);
  out += "    first positions:";
  for (std::size_t p = 0; p < std::min<std::size_t>(a.row_norms.size(), 6); ++p) {
    out += format(" %.3g", a.row_norms[p]);
  }
  out += "\n";
  if (a.zero_rows > 0) {
    out += format("    %lld rows are all zeros (padding rows?); their cosines count as 0\n",
                  static_cast<long long>(a.zero_rows));
  }
  const auto& nc = a.neighbour_cosine;
  const auto [nmin, nmax] = std::minmax_element(nc.begin(), nc.end());
  double nmean = 0;
  for (double v : nc) nmean += v;
  nmean /= static_cast<double>(nc.size());
  out +=
      format("  neighbour cosine cos(p, p+1): mean %.3f, min %.3f (p = %td), max %.3f (p = %td)\n",
             nmean, *nmin, nmin - nc.begin(), *nmax, nmax - nc.begin());
  out += "    first positions:";
  for (std::size_t p = 0; p < std::min<std::size_t>(nc.size(), 6); ++p)
    out += format(" %.3f", nc[p]);
  out += "\n";
  return out;
}

std::string analysis_json(const TableAnalysis& a, const std::string& source) {
  nlohmann::ordered_json j;
  j["format"] = "posembed-analyze";
  j["version"] = 1;
  j["source"] = source;
  j["rows"] = a.rows;
  j["cols"] = a.cols;
  j["components"] = {{"90", a.components_90}, {"95", a.components_95}, {"99", a.components_99}};
  j["participation_ratio"] = a.participation_ratio;
  j["gap_rank"] = a.gap_rank;
  j["gap_ratio"] = a.gap_ratio;
  j["mean_row_norm"] = a.mean_row_norm;
  j["zero_rows"] = a.zero_rows;
  j["singular_values"] = a.singular_values;
  j["variance_ratio"] = a.variance_ratio;
  j["row_norms"] = a.row_norms;
  j["neighbour_cosine"] = a.neighbour_cosine;
  return j.dump(1) + "\n";
}

}  // namespace posembed::tools
