#include "posembed/tools/analyze_plot.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "posembed/core/error.h"
#include "posembed/tools/format.h"
#include "posembed/tools/plot.h"

namespace posembed::tools {

void write_table_heatmap(const std::filesystem::path& path, std::span<const float> table,
                         std::int64_t rows, std::int64_t cols, const std::string& title,
                         std::int64_t max_positions) {
  if (max_positions < 1) {
    throw Error("heatmap: max_positions " + std::to_string(max_positions) + " must be >= 1");
  }
  const std::int64_t stride = (rows + max_positions - 1) / max_positions;
  Heatmap h;
  h.title = title;
  h.axis_label = stride > 1 ? format("position (1 in %lld drawn)", static_cast<long long>(stride))
                            : std::string("position");
  h.value_label = "cosine similarity";
  h.values = cosine_matrix(table, rows, cols, stride);
  h.n = (rows + stride - 1) / stride;
  h.step = static_cast<double>(stride);
  h.last = static_cast<double>(rows - 1);
  write_heatmap(path, h);
}

void write_spectrum_plot(const std::filesystem::path& path, const TableAnalysis& a,
                         const std::string& title) {
  const auto& s = a.singular_values;
  const std::size_t k = s.size();
  // The data with a dot per component; the marks dashed, named in the legend.
  const auto data = [](std::vector<double> x, std::vector<double> y) {
    PlotSeries d;
    d.colour = series_colour(0);
    d.x = std::move(x);
    d.y = std::move(y);
    d.markers = true;
    return d;
  };
  const auto mark = [](std::string label, int colour, std::vector<double> x,
                       std::vector<double> y) {
    PlotSeries m;
    m.label = std::move(label);
    m.colour = series_colour(colour);
    m.x = std::move(x);
    m.y = std::move(y);
    m.dashed = true;
    return m;
  };
  LinePlot sv, cum;
  sv.height = 400;
  sv.x_label = cum.x_label = format("component (log scale, %zu in all)", k);
  sv.log_x = cum.log_x = true;
  std::vector<double> component(k);
  for (std::size_t i = 0; i < k; ++i) component[i] = static_cast<double>(i + 1);
  if (k == 0 || s[0] <= 0) {  // nothing to put on a log axis
    sv.title = "Singular values: all 0 (every row is the same; the centred table is zero)";
    sv.y_label = "singular value";
    sv.series.push_back(k == 0 ? data({1}, {0}) : data(component, s));
    write_line_plots(path, std::span<const LinePlot>(&sv, 1), title);
    return;
  }

  // Singular values on a log scale, whole decades, clipped below at 1e-7 of the largest.
  sv.title = "Singular values of the mean-centred table";
  sv.y_label = "singular value (log scale)";
  sv.log_y = true;
  sv.y_max = std::pow(10.0, std::ceil(std::log10(s[0])));
  sv.y_min = std::pow(10.0, std::floor(std::log10(std::max(s.back(), s[0] * 1e-7))));
  if (sv.y_min >= sv.y_max) sv.y_min = sv.y_max / 10;
  std::vector<double> shown(k);
  for (std::size_t i = 0; i < k; ++i) shown[i] = std::max(s[i], sv.y_min);
  sv.series.push_back(data(component, shown));
  if (a.gap_rank > 0 && static_cast<std::size_t>(a.gap_rank) < k) {
    const auto g = static_cast<long long>(a.gap_rank);
    const double between = std::sqrt(static_cast<double>(g) * static_cast<double>(g + 1));
    sv.series.push_back(
        mark(format("largest gap after %lld component%s: s_{%lld} / s_{%lld} = %.3g", g,
                    g == 1 ? "" : "s", g, g + 1, a.gap_ratio),
             1, {between, between}, {sv.y_min, sv.y_max}));
  }

  // Cumulative variance in percent, with the 90/95/99% marks.
  cum.title = format("Cumulative variance (participation ratio %.1f)", a.participation_ratio);
  cum.y_label = "cumulative variance (%)";
  cum.y_min = 0;
  cum.y_max = 100;
  std::vector<double> total(k);
  double sum = 0;
  for (std::size_t i = 0; i < k; ++i) total[i] = 100 * (sum += a.variance_ratio[i]);
  cum.series.push_back(data(component, total));
  const std::tuple<double, std::int64_t, int> marks[] = {
      {90, a.components_90, 1}, {95, a.components_95, 3}, {99, a.components_99, 4}};
  for (const auto& [pct, comp, colour] : marks) {
    const double c = static_cast<double>(comp);
    cum.series.push_back(mark(format("%.0f%%: %lld components", pct, static_cast<long long>(comp)),
                              colour, {1, c, c}, {pct, pct, 0}));
  }
  const LinePlot panels[] = {sv, cum};
  write_line_plots(path, panels, title);
}

}  // namespace posembed::tools
