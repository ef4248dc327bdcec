// posembed._C's checkpoint files and table analysis: inspect, resize, analyze.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "posembed/core/error.h"
#include "posembed/io/inspect.h"
#include "posembed/io/resize.h"
#include "posembed/tools/analyze.h"
#include "python/arrays.h"
#include "python/bindings.h"

namespace posembed::python {
namespace {

using namespace nb::literals;

io::DetectOptions detect(const std::optional<std::string>& name,
                         std::optional<std::int64_t> offset) {
  io::DetectOptions options;
  options.position_name = name;
  options.offset_rows = offset;
  return options;
}

std::string inspect_json(const std::string& path, std::optional<std::string> name,
                         std::optional<std::int64_t> offset) {
  return io::inspect_json(path, detect(name, offset));
}

nb::dict resize(const std::string& in, const std::string& out, std::int64_t max_seq_len,
                const std::string& method, std::optional<std::string> name,
                std::optional<std::int64_t> offset, std::optional<std::string> init,
                std::optional<std::uint64_t> seed) {
  io::ResizeOptions options;
  options.max_seq_len = max_seq_len;
  options.method = io::parse_resize_method(method);
  options.detect = detect(name, offset);
  if (init) options.init = parse_table_init(*init);
  options.seed = seed;
  io::ResizeReport r;
  {
    nb::gil_scoped_release release;
    r = io::resize_checkpoint(in, out, options);
  }
  nb::dict d;
  d["input"] = in;
  d["output"] = out;
  d["tensor"] = r.position_name;
  d["family"] = r.tables.family;
  d["dtype"] = std::string(io::dtype_name(r.dtype));
  d["method"] = std::string(io::to_string(r.rows.method));
  d["offset_rows"] = r.rows.offset_rows;
  d["old_max_seq_len"] = r.rows.old_len;
  d["max_seq_len"] = r.rows.new_len;
  d["embed_dim"] = r.rows.embed_dim;
  if (r.rows.method == io::ResizeMethod::init) {
    d["init"] = to_string(r.rows.init);
    d["seed"] = r.rows.seed;
  }
  d["tensors_copied"] = r.tensors_copied;
  d["notes"] = r.notes;
  return d;
}

template <class T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> owned_vector(std::vector<T> values) {
  auto* heap = new std::vector<T>(std::move(values));
  nb::capsule owner(heap, [](void* v) noexcept { delete static_cast<std::vector<T>*>(v); });
  return {heap->data(), {heap->size()}, owner};
}

nb::dict analyze(In table) {
  const auto t = view<const float>(table, "table", 2);
  tools::TableAnalysis a;
  {
    nb::gil_scoped_release release;
    a = tools::analyze_table(t, dim(table, 0), dim(table, 1));
  }
  nb::dict d;
  d["rows"] = a.rows;
  d["cols"] = a.cols;
  d["components_90"] = a.components_90;
  d["components_95"] = a.components_95;
  d["components_99"] = a.components_99;
  d["participation_ratio"] = a.participation_ratio;
  d["gap_rank"] = a.gap_rank;
  d["gap_ratio"] = a.gap_ratio;
  d["mean_row_norm"] = a.mean_row_norm;
  d["zero_rows"] = a.zero_rows;
  d["singular_values"] = owned_vector(std::move(a.singular_values));
  d["variance_ratio"] = owned_vector(std::move(a.variance_ratio));
  d["row_norms"] = owned_vector(std::move(a.row_norms));
  d["neighbour_cosine"] = owned_vector(std::move(a.neighbour_cosine));
  return d;
}

}  // namespace

void bind_files(nb::module_& m) {
  m.def("inspect_json", &inspect_json, "path"_a, "name"_a = nb::none(), "offset"_a = nb::none());
  m.def("resize", &resize, "path"_a, "out"_a, "max_seq_len"_a, "method"_a, "name"_a = nb::none(),
        "offset"_a = nb::none(), "init"_a = nb::none(), "seed"_a = nb::none());
  m.def("analyze", &analyze, "table"_a);
}

}  // namespace posembed::python
