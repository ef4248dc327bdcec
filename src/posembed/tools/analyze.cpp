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

#include <nlohmann/json.hpp>

#include "posembed/core/error.h"
#include "posembed/tools/canvas.h"
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

// The title at scale 2 if it fits the image, else at scale 1.
void draw_title(Canvas& c, int left, const std::string& title) {
  const int scale = Canvas::text_width(title, 2) <= c.width() - left - 8 ? 2 : 1;
  c.text(left, scale == 2 ? 12 : 18, title, kBlack, scale);
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
  const Eigen::RowVectorXd mean = x.colwise().mean();                    // (cols,)
  const Eigen::MatrixXd centred = x.rowwise() - mean;                    // (rows, cols)
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
    for (std::size_t j = 0; j < d; ++j) sum += static_cast<double>(table[p * d + j]) * table[p * d + j];
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

std::vector<float> cosine_matrix(std::span<const float> table, std::int64_t rows,
                                 std::int64_t cols, std::int64_t stride) {
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

void write_heatmap_png(const std::filesystem::path& path, std::span<const float> table,
                       std::int64_t rows, std::int64_t cols, const std::string& title,
                       std::int64_t max_positions) {
  if (max_positions < 1) {
    throw Error("heatmap: max_positions " + std::to_string(max_positions) + " must be >= 1");
  }
  const std::int64_t stride = (rows + max_positions - 1) / max_positions;
  const std::vector<float> cos = cosine_matrix(table, rows, cols, stride);
  const int count = static_cast<int>((rows + stride - 1) / stride);
  const int scale = std::max(1, (512 + count - 1) / count);  // small tables drawn at >= 512 px
  const int plot = count * scale;
  const int left = 70, top = 44, right = 120, bottom = 56;
  Canvas c(left + plot + right, top + plot + bottom);

  draw_title(c, left, title);
  for (int i = 0; i < count; ++i) {
    for (int j = 0; j < count; ++j) {
      const Rgb colour = diverging_colour(cos[static_cast<std::size_t>(i) * count + j]);
      c.fill_rect(left + j * scale, top + i * scale, left + (j + 1) * scale,
                  top + (i + 1) * scale, colour);
    }
  }
  // Frame and position ticks on both axes (row i of the image is position i * stride).
  c.line(left - 1, top - 1, left + plot, top - 1, kBlack);
  c.line(left - 1, top + plot, left + plot, top + plot, kBlack);
  c.line(left - 1, top - 1, left - 1, top + plot, kBlack);
  c.line(left + plot, top - 1, left + plot, top + plot, kBlack);
  for (double t : nice_ticks(0, static_cast<double>(rows - 1), 8)) {
    const int px = static_cast<int>(std::lround(t / static_cast<double>(stride) * scale)) +
                   scale / 2;
    const std::string label = format("%.0f", t);
    c.line(left + px, top + plot, left + px, top + plot + 4, kBlack);
    c.text(left + px - Canvas::text_width(label) / 2, top + plot + 8, label, kBlack);
    c.line(left - 5, top + px, left - 1, top + px, kBlack);
    c.text(left - 8 - Canvas::text_width(label), top + px - 3, label, kBlack);
  }
  const std::string axis = stride > 1 ? format("POSITION (1 IN %lld DRAWN)",
                                               static_cast<long long>(stride))
                                      : std::string("POSITION");
  c.text(left + plot / 2 - Canvas::text_width(axis) / 2, top + plot + 26, axis, kBlack);
  c.text_vertical(14, top + plot / 2 + Canvas::text_width("POSITION") / 2, "POSITION", kBlack);

  // Colour scale: +1 at the top, -1 at the bottom.
  const int bar_x = left + plot + 24, bar_w = 20;
  for (int y = 0; y < plot; ++y) {
    const double v = 1.0 - 2.0 * (y + 0.5) / plot;
    c.fill_rect(bar_x, top + y, bar_x + bar_w, top + y + 1, diverging_colour(v));
  }
  c.line(bar_x - 1, top - 1, bar_x + bar_w, top - 1, kBlack);
  c.line(bar_x - 1, top + plot, bar_x + bar_w, top + plot, kBlack);
  c.line(bar_x - 1, top - 1, bar_x - 1, top + plot, kBlack);
  c.line(bar_x + bar_w, top - 1, bar_x + bar_w, top + plot, kBlack);
  for (double v : {1.0, 0.5, 0.0, -0.5, -1.0}) {
    const int y = top + static_cast<int>(std::lround((1.0 - v) / 2.0 * (plot - 1)));
    c.line(bar_x + bar_w, y, bar_x + bar_w + 4, y, kBlack);
    c.text(bar_x + bar_w + 7, y - 3, format("%+.1f", v), kBlack);
  }
  c.text_vertical(bar_x + bar_w + 48,
                  top + plot / 2 + Canvas::text_width("COSINE SIMILARITY") / 2,
                  "COSINE SIMILARITY", kBlack);
  c.write_png(path);
}

void write_spectrum_png(const std::filesystem::path& path, const TableAnalysis& a,
                        const std::string& title) {
  const int width = 900, left = 80, right = 30, panel_h = 260, top = 64, gap = 90;
  const int plot_w = width - left - right;
  const int height = top + 2 * panel_h + gap + 50;
  Canvas c(width, height);
  draw_title(c, left, title);
  const auto& s = a.singular_values;
  const int k = static_cast<int>(s.size());
  if (k == 0 || s[0] <= 0) {
    c.text(left, top + 20, "ALL ROWS ARE EQUAL: THE CENTRED TABLE IS ZERO", kBlack, 2);
    c.write_png(path);
    return;
  }
  // Component index on a log axis from 1 to k (the leading components matter most).
  const double log_k = std::log10(std::max(k, 2));
  const auto x_of = [&](double component) {
    return left + static_cast<int>(std::lround(std::log10(component) / log_k * plot_w));
  };
  const auto frame = [&](int y0) {
    c.line(left, y0, left + plot_w, y0, kBlack);
    c.line(left, y0 + panel_h, left + plot_w, y0 + panel_h, kBlack);
    c.line(left, y0, left, y0 + panel_h, kBlack);
    c.line(left + plot_w, y0, left + plot_w, y0 + panel_h, kBlack);
  };
  const auto x_ticks = [&](int y0) {
    for (double decade = 1; decade <= k; decade *= 10) {
      for (double m : {1.0, 2.0, 5.0}) {
        const double t = m * decade;
        if (t > k) break;
        const int px = x_of(t);
        c.line(px, y0 + 1, px, y0 + panel_h - 1, kLightGrey);
        c.line(px, y0 + panel_h, px, y0 + panel_h + 4, kBlack);
        const std::string label = format("%.0f", t);
        c.text(px - Canvas::text_width(label) / 2, y0 + panel_h + 8, label, kBlack);
      }
    }
  };
  const std::string axis = format("COMPONENT, LOG SCALE (%d IN ALL)", k);
  const Rgb blue{33, 102, 172}, red{178, 24, 43};

  // Top panel: log10 singular values, clipped below at 1e-7 of the largest.
  const int y1 = top;
  const double hi = std::ceil(std::log10(s[0]));
  const double lo_value = std::max(s.back(), s[0] * 1e-7);
  double lo = std::floor(std::log10(lo_value));
  if (lo >= hi) lo = hi - 1;
  const auto y_of_log = [&](double v) {
    const double lv = std::log10(std::max(v, std::pow(10.0, lo)));
    return y1 + static_cast<int>(std::lround((hi - lv) / (hi - lo) * panel_h));
  };
  c.text(left, y1 - 14, "SINGULAR VALUES OF THE MEAN-CENTRED TABLE (LOG SCALE)", kBlack);
  x_ticks(y1);
  const int decades = static_cast<int>(hi - lo);
  const int every = std::max(1, decades / 6);
  for (int e = static_cast<int>(lo); e <= static_cast<int>(hi); e += every) {
    const int y = y_of_log(std::pow(10.0, e));
    c.dashed_hline(left + 1, left + plot_w - 1, y, kGrey);
    const std::string label = "1E" + std::to_string(e);
    c.line(left - 4, y, left, y, kBlack);
    c.text(left - 8 - Canvas::text_width(label), y - 3, label, kBlack);
  }
  if (a.gap_rank > 0 && a.gap_rank < k) {
    const double g = static_cast<double>(a.gap_rank);
    const int gx = (x_of(g) + x_of(g + 1.0)) / 2;
    for (int y = y1 + 1; y < y1 + panel_h; y += 2) c.set(gx, y, red);
    c.text(gx + 4, y1 + 6,
           format("LARGEST GAP AFTER %lld (RATIO %.3g)", static_cast<long long>(a.gap_rank),
                  a.gap_ratio),
           red);
  }
  for (int i = 0; i < k; ++i) {
    const int px = x_of(i + 1), py = y_of_log(s[static_cast<std::size_t>(i)]);
    if (i > 0) c.line(x_of(i), y_of_log(s[static_cast<std::size_t>(i) - 1]), px, py, blue);
    c.fill_rect(px - 1, py - 1, px + 2, py + 2, blue);
  }
  frame(y1);
  c.text(left + plot_w / 2 - Canvas::text_width(axis) / 2, y1 + panel_h + 22, axis, kBlack);

  // Bottom panel: cumulative variance in percent, with the 90/95/99% marks.
  const int y2 = top + panel_h + gap;
  const auto y_of_pct = [&](double pct) {
    return y2 + static_cast<int>(std::lround((100.0 - pct) / 100.0 * panel_h));
  };
  c.text(left, y2 - 14,
         format("CUMULATIVE VARIANCE (PARTICIPATION RATIO %.1f)", a.participation_ratio), kBlack);
  x_ticks(y2);
  for (double t : {0.0, 20.0, 40.0, 60.0, 80.0, 100.0}) {
    const int y = y_of_pct(t);
    c.dashed_hline(left + 1, left + plot_w - 1, y, kGrey);
    const std::string label = format("%.0f%%", t);
    c.line(left - 4, y, left, y, kBlack);
    c.text(left - 8 - Canvas::text_width(label), y - 3, label, kBlack);
  }
  double cum = 0;
  int prev_x = 0, prev_y = 0;
  for (int i = 0; i < k; ++i) {
    cum += a.variance_ratio[static_cast<std::size_t>(i)];
    const int px = x_of(i + 1), py = y_of_pct(100 * cum);
    if (i > 0) c.line(prev_x, prev_y, px, py, blue);
    c.fill_rect(px - 1, py - 1, px + 2, py + 2, blue);
    prev_x = px;
    prev_y = py;
  }
  const std::pair<double, std::int64_t> marks[] = {
      {90, a.components_90}, {95, a.components_95}, {99, a.components_99}};
  int label_y = y2 + panel_h - 44;
  for (const auto& [pct, comp] : marks) {
    const int px = x_of(static_cast<double>(comp)), py = y_of_pct(pct);
    c.line(px, py, px, y2 + panel_h, red);
    c.line(left, py, px, py, red);
    c.fill_rect(px - 2, py - 2, px + 3, py + 3, red);
    const std::string label = format("%.0f%%: %lld COMPONENTS", pct, static_cast<long long>(comp));
    c.text(left + plot_w - Canvas::text_width(label) - 8, label_y, label, red);
    label_y += 12;
  }
  frame(y2);
  c.text(left + plot_w / 2 - Canvas::text_width(axis) / 2, y2 + panel_h + 22, axis, kBlack);
  c.write_png(path);
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
  out += format("  components for 90%% / 95%% / 99%% of the variance: %lld / %lld / %lld (of %zu)\n",
                static_cast<long long>(a.components_90), static_cast<long long>(a.components_95),
                static_cast<long long>(a.components_99), k);
  out += format("  participation ratio: %.2f\n", a.participation_ratio);
  out += format("  largest spectral gap: after %lld components (s_k / s_k+1 = %.3g)\n",
                static_cast<long long>(a.gap_rank), a.gap_ratio);
  const auto [min_it, max_it] = std::minmax_element(a.row_norms.begin(), a.row_norms.end());
  double mean_norm = 0;
  for (double v : a.row_norms) mean_norm += v;
  mean_norm /= static_cast<double>(a.row_norms.size());
  out += format("  per-position norm: mean %.4g, min %.4g (position %td), max %.4g (position %td); "
                "norm of the mean row %.4g\n",
                mean_norm, *min_it, min_it - a.row_norms.begin(), *max_it,
                max_it - a.row_norms.begin(), a.mean_row_norm);
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
  out += format("  neighbour cosine cos(p, p+1): mean %.3f, min %.3f (p = %td), max %.3f (p = %td)\n",
                nmean, *nmin, nmin - nc.begin(), *nmax, nmax - nc.begin());
  out += "    first positions:";
  for (std::size_t p = 0; p < std::min<std::size_t>(nc.size(), 6); ++p) out += format(" %.3f", nc[p]);
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
