// Python bindings of the CPU kernels (sampling, relabel, gathers, nn ops): pybind11 on numpy buffers.
//
// Arrays are checked (1-D, C-contiguous, exact dtype) and never converted,
// so large memory-mapped or shared-memory graphs are read in place. The GIL
// is released while the kernels run; outputs are handed to numpy without a
// copy.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "nn_ops.h"
#include "optim.h"
#include "relabel.h"
#include "rows.h"
#include "sample.h"
#include "temporal.h"

// Hash of the sources, set by the build (distgnn/native/cpu.py), so a
// stale installed binary can be told apart from the current sources.
#ifndef DISTGNN_BUILD_KEY
#define DISTGNN_BUILD_KEY "unknown"
#endif

namespace py = pybind11;

namespace {

// array_t::check_ compares dtypes with PyArray_EquivTypes (byte order included).
template <typename T>
bool has_dtype(const py::array& a) {
  return py::isinstance<py::array_t<T>>(a);
}

std::string dtype_name(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

void check_vector(const py::array& a, const char* name) {
  if (a.ndim() != 1)
    throw std::invalid_argument(std::string(name) + " must be 1-D, got " + std::to_string(a.ndim()) + " dimensions");
  if (a.shape(0) > 1 && a.strides(0) != a.itemsize())
    throw std::invalid_argument(std::string(name) + " must be C-contiguous; pass np.ascontiguousarray(" + name + ")");
}

template <typename T>
const T* vector_data(const py::array& a, const char* name, const char* expected) {
  check_vector(a, name);
  if (!has_dtype<T>(a))
    throw std::invalid_argument(std::string(name) + " must have dtype " + expected + ", got " + dtype_name(a));
  return static_cast<const T*>(a.data());
}

template <typename Vector>
py::array_t<typename Vector::value_type> to_numpy(Vector&& values) {
  auto* owner = new Vector(std::move(values));
  py::capsule free_owner(owner, [](void* p) { delete static_cast<Vector*>(p); });
  return py::array_t<typename Vector::value_type>(static_cast<py::ssize_t>(owner->size()), owner->data(), free_owner);
}

py::tuple sample_neighbors(const py::array& indptr, const py::array& indices, const py::array& seeds, int64_t fanout,
                           bool replace, const py::object& prob, uint64_t rng_seed, int num_threads,
                           bool return_neighbors, const py::object& fanouts) {
  const int64_t* indptr_data = vector_data<int64_t>(indptr, "indptr", "int64");
  check_vector(indices, "indices");
  if (!has_dtype<int32_t>(indices) && !has_dtype<int64_t>(indices))
    throw std::invalid_argument("indices must have dtype int32 or int64, got " + dtype_name(indices));
  const int64_t* seeds_data = vector_data<int64_t>(seeds, "seeds", "int64");

  const int64_t num_edges = indices.shape(0);
  if (indptr.shape(0) < 1) throw std::invalid_argument("indptr must have num_nodes + 1 >= 1 entries, got 0");
  const int64_t num_nodes = indptr.shape(0) - 1;
  if (indptr_data[0] != 0 || indptr_data[num_nodes] != num_edges)
    throw std::invalid_argument("indptr must start at 0 and end at len(indices) = " + std::to_string(num_edges) +
                                ", got indptr[0] = " + std::to_string(indptr_data[0]) + ", indptr[-1] = " +
                                std::to_string(indptr_data[num_nodes]));

  const float* prob_data = nullptr;
  py::array prob_array;
  if (!prob.is_none()) {
    prob_array = py::cast<py::array>(prob);
    prob_data = vector_data<float>(prob_array, "prob", "float32");
    if (prob_array.shape(0) != num_edges)
      throw std::invalid_argument("prob must have one weight per edge (" + std::to_string(num_edges) + "), got " +
                                  std::to_string(prob_array.shape(0)));
  }

  const int64_t num_seeds = seeds.shape(0);
  const int64_t* fanouts_data = nullptr;
  py::array fanouts_array;
  if (!fanouts.is_none()) {
    fanouts_array = py::cast<py::array>(fanouts);
    fanouts_data = vector_data<int64_t>(fanouts_array, "fanouts", "int64");
    if (fanouts_array.shape(0) != num_seeds)
      throw std::invalid_argument("fanouts must have one entry per seed (" + std::to_string(num_seeds) + "), got " +
                                  std::to_string(fanouts_array.shape(0)));
  }
  py::array_t<int64_t> counts(num_seeds);
  int64_t* counts_data = counts.mutable_data();
  const bool int32_indices = has_dtype<int32_t>(indices);
  const distgnn::CscView graph{indptr_data, num_nodes, num_edges,
                               int32_indices ? static_cast<const int32_t*>(indices.data()) : nullptr,
                               int32_indices ? nullptr : static_cast<const int64_t*>(indices.data())};
  distgnn::SampleOutput output;
  {
    py::gil_scoped_release release;
    output = distgnn::sample_neighbors(graph, seeds_data, num_seeds, fanout, fanouts_data, replace, prob_data,
                                       rng_seed, num_threads, return_neighbors, counts_data);
  }
  if (!return_neighbors) return py::make_tuple(counts, to_numpy(std::move(output.positions)));
  return py::make_tuple(counts, to_numpy(std::move(output.positions)), to_numpy(std::move(output.neighbors)));
}

py::array_t<int64_t> take(const py::array& values, const py::array& positions, int num_threads) {
  check_vector(values, "values");
  const bool int32_values = has_dtype<int32_t>(values);
  if (!int32_values && !has_dtype<int64_t>(values))
    throw std::invalid_argument("values must have dtype int32 or int64, got " + dtype_name(values));
  const int64_t* positions_data = vector_data<int64_t>(positions, "positions", "int64");
  const int64_t n = positions.shape(0), num_values = values.shape(0);
  py::array_t<int64_t> out(n);
  int64_t* out_data = out.mutable_data();
  {
    py::gil_scoped_release release;
    if (int32_values)
      distgnn::take(static_cast<const int32_t*>(values.data()), num_values, positions_data, n, num_threads, out_data);
    else
      distgnn::take(static_cast<const int64_t*>(values.data()), num_values, positions_data, n, num_threads, out_data);
  }
  return out;
}

py::tuple relabel(const py::array& dst_nids, const py::array& src_nids_per_edge) {
  const int64_t* dst = vector_data<int64_t>(dst_nids, "dst_nids", "int64");
  const int64_t* src = vector_data<int64_t>(src_nids_per_edge, "src_nids_per_edge", "int64");
  const int64_t num_dst = dst_nids.shape(0), num_edges = src_nids_per_edge.shape(0);
  py::array_t<int64_t> indices(num_edges);
  int64_t* indices_data = indices.mutable_data();
  std::vector<int64_t> nids;
  {
    py::gil_scoped_release release;
    nids = distgnn::relabel(dst, num_dst, src, num_edges, indices_data);
  }
  return py::make_tuple(to_numpy(std::move(nids)), indices);
}

// A C-contiguous float32 array of `ndim` dimensions (writable when asked), else ValueError naming it.
float* float_data(const py::array& a, const char* name, int ndim, bool writable) {
  if (a.ndim() != ndim)
    throw std::invalid_argument(std::string(name) + " must be " + std::to_string(ndim) + "-D, got " +
                                std::to_string(a.ndim()) + " dimensions");
  if (!has_dtype<float>(a)) throw std::invalid_argument(std::string(name) + " must have dtype float32, got " + dtype_name(a));
  if (!(a.flags() & py::array::c_style)) throw std::invalid_argument(std::string(name) + " must be C-contiguous");
  if (writable && !a.writeable()) throw std::invalid_argument(std::string(name) + " must be writable");
  return static_cast<float*>(const_cast<void*>(a.data()));
}

void check_columns(int64_t col, int64_t f, int64_t stride, const char* name) {
  if (col < -1 || col + f > stride)
    throw std::invalid_argument(std::string(name) + " " + std::to_string(col) + " with width " + std::to_string(f) +
                                " does not fit a row of " + std::to_string(stride));
}

// The output checks of mean_aggregate and mean_aggregate_tables: out (num_dst, >= f) rows, the mean (and self)
// columns inside a row, and at least num_dst source rows when the self rows are copied (`sources` names them).
void check_mean_out(const py::array& out, int64_t num_dst, int64_t f, int64_t mean_col, int64_t self_col,
                    int64_t num_src, const char* sources) {
  const int64_t stride = out.shape(1);
  if (out.shape(0) != num_dst)
    throw std::invalid_argument("out has " + std::to_string(out.shape(0)) + " rows for " + std::to_string(num_dst) +
                                " destinations");
  if (mean_col < 0) throw std::invalid_argument("mean_col must be >= 0");
  check_columns(mean_col, f, stride, "mean_col");
  check_columns(self_col, f, stride, "self_col");
  if (self_col >= 0 && num_src < num_dst)
    throw std::invalid_argument(std::string(sources) + " " + std::to_string(num_src) + " rows, fewer than the " +
                                std::to_string(num_dst) + " destinations they must start with");
}

void mean_aggregate(const py::array& indptr, const py::array& indices, const py::array& x, const py::array& out,
                    int64_t mean_col, int64_t self_col, int num_threads, bool average) {
  const int64_t* indptr_data = vector_data<int64_t>(indptr, "indptr", "int64");
  const int64_t* indices_data = vector_data<int64_t>(indices, "indices", "int64");
  const float* x_data = float_data(x, "x", 2, false);
  float* out_data = float_data(out, "out", 2, true);
  if (indptr.shape(0) < 1) throw std::invalid_argument("indptr must hold at least one entry");
  const int64_t num_dst = indptr.shape(0) - 1, f = x.shape(1), stride = out.shape(1);
  check_mean_out(out, num_dst, f, mean_col, self_col, x.shape(0), "x has");
  py::gil_scoped_release release;
  distgnn::mean_aggregate(indptr_data, indices_data, num_dst, indices.shape(0), x_data, x.shape(0), f, out_data, stride,
                          mean_col, self_col, num_threads, average);
}

void mean_aggregate_tables(const py::array& indptr, const py::array& indices, const py::list& tables,
                           const py::array& row_table, const py::array& row_index, const py::array& out,
                           int64_t mean_col, int64_t self_col, int num_threads) {
  const int64_t* indptr_data = vector_data<int64_t>(indptr, "indptr", "int64");
  const int64_t* indices_data = vector_data<int64_t>(indices, "indices", "int64");
  const int64_t* table_of = vector_data<int64_t>(row_table, "row_table", "int64");
  const int64_t* index_of = vector_data<int64_t>(row_index, "row_index", "int64");
  float* out_data = float_data(out, "out", 2, true);
  if (indptr.shape(0) < 1) throw std::invalid_argument("indptr must hold at least one entry");
  if (tables.empty()) throw std::invalid_argument("tables must hold at least one table");
  const int64_t num_src = row_table.shape(0), num_dst = indptr.shape(0) - 1, stride = out.shape(1);
  if (row_index.shape(0) != num_src)
    throw std::invalid_argument("row_index has " + std::to_string(row_index.shape(0)) + " entries, row_table " +
                                std::to_string(num_src));
  std::vector<py::array> held;  // keeps each table's buffer alive for the call
  std::vector<const float*> bases;
  std::vector<int64_t> lengths;
  int64_t f = -1;
  for (const auto& item : tables) {
    held.push_back(py::reinterpret_borrow<py::array>(item));
    const std::string name = "tables[" + std::to_string(bases.size()) + "]";
    bases.push_back(float_data(held.back(), name.c_str(), 2, false));
    lengths.push_back(held.back().shape(0));
    if (f < 0) f = held.back().shape(1);
    if (held.back().shape(1) != f)
      throw std::invalid_argument(name + " has " + std::to_string(held.back().shape(1)) + " columns, tables[0] " +
                                  std::to_string(f));
  }
  check_mean_out(out, num_dst, f, mean_col, self_col, num_src, "the tables give");
  std::vector<const float*> rows(static_cast<size_t>(num_src));
  for (int64_t s = 0; s < num_src; ++s) {
    const int64_t t = table_of[s], r = index_of[s];
    if (t < 0 || t >= static_cast<int64_t>(bases.size()))
      throw std::invalid_argument("row_table[" + std::to_string(s) + "] = " + std::to_string(t) + " is not one of " +
                                  std::to_string(bases.size()) + " tables");
    if (r < 0 || r >= lengths[t])
      throw std::invalid_argument("row_index[" + std::to_string(s) + "] = " + std::to_string(r) +
                                  " is out of range for the " + std::to_string(lengths[t]) + " rows of tables[" +
                                  std::to_string(t) + "]");
    rows[s] = bases[t] + r * f;
  }
  py::gil_scoped_release release;
  distgnn::mean_aggregate_rows(indptr_data, indices_data, num_dst, indices.shape(0), rows.data(), num_src, f, out_data,
                               stride, mean_col, self_col, num_threads);
}

void mean_aggregate_backward(const py::array& indptr, const py::array& indices, const py::array& grad,
                             int64_t mean_col, int64_t self_col, const py::array& grad_x, int num_threads) {
  const int64_t* indptr_data = vector_data<int64_t>(indptr, "indptr", "int64");
  const int64_t* indices_data = vector_data<int64_t>(indices, "indices", "int64");
  const float* grad_data = float_data(grad, "grad", 2, false);
  float* grad_x_data = float_data(grad_x, "grad_x", 2, true);
  const int64_t num_dst = indptr.shape(0) - 1, f = grad_x.shape(1), stride = grad.shape(1);
  if (grad.shape(0) != num_dst)
    throw std::invalid_argument("grad has " + std::to_string(grad.shape(0)) + " rows for " + std::to_string(num_dst) +
                                " destinations");
  check_columns(mean_col, f, stride, "mean_col");
  check_columns(self_col, f, stride, "self_col");
  py::gil_scoped_release release;
  distgnn::mean_aggregate_backward(indptr_data, indices_data, num_dst, grad_data, stride, mean_col, self_col,
                                   grad_x_data, grad_x.shape(0), f, num_threads);
}

void relu_dropout_mean_backward(const py::array& indptr, const py::array& indices, const py::array& grad,
                                const py::array& out, float scale, const py::array& grad_h, int num_threads) {
  const int64_t* indptr_data = vector_data<int64_t>(indptr, "indptr", "int64");
  const int64_t* indices_data = vector_data<int64_t>(indices, "indices", "int64");
  const float* grad_data = float_data(grad, "grad", 2, false);
  const float* out_data = float_data(out, "out", 2, false);
  float* grad_h_data = float_data(grad_h, "grad_h", 2, true);
  if (indptr.shape(0) < 1) throw std::invalid_argument("indptr must hold at least one entry");
  const int64_t num_dst = indptr.shape(0) - 1, num_src = out.shape(0), f = out.shape(1);
  if (grad.shape(0) != num_dst || grad.shape(1) != 2 * f)
    throw std::invalid_argument("grad must be (" + std::to_string(num_dst) + ", " + std::to_string(2 * f) + ")");
  if (grad_h.shape(0) != num_src || grad_h.shape(1) != f) throw std::invalid_argument("grad_h must be shaped as out");
  if (num_src < num_dst) throw std::invalid_argument("out has fewer rows than the destinations");
  if (indptr_data[0] != 0 || indptr_data[num_dst] != indices.shape(0))
    throw std::invalid_argument("indptr must run from 0 to the number of edges");
  for (int64_t d = 0; d < num_dst; ++d)
    if (indptr_data[d + 1] < indptr_data[d]) throw std::invalid_argument("indptr must not decrease");
  py::gil_scoped_release release;
  distgnn::relu_dropout_mean_backward(indptr_data, indices_data, num_dst, grad_data, out_data, num_src, f, scale,
                                      grad_h_data, num_threads);
}

void relu_dropout(const py::array& x, const py::array& out, uint32_t drop_threshold, float scale, uint64_t rng_seed,
                  int num_threads) {
  const float* x_data = float_data(x, "x", 1, false);
  float* out_data = float_data(out, "out", 1, true);
  if (out.shape(0) != x.shape(0)) throw std::invalid_argument("out and x differ in length");
  if (drop_threshold > 65536) throw std::invalid_argument("drop_threshold must be at most 65536");
  py::gil_scoped_release release;
  distgnn::relu_dropout(x_data, out_data, x.shape(0), drop_threshold, scale, rng_seed, num_threads);
}

void relu_dropout_backward(const py::array& out, const py::array& grad, const py::array& grad_in, float scale,
                           int num_threads) {
  const float* out_data = float_data(out, "out", 1, false);
  const float* grad_data = float_data(grad, "grad", 1, false);
  float* grad_in_data = float_data(grad_in, "grad_in", 1, true);
  if (grad.shape(0) != out.shape(0) || grad_in.shape(0) != out.shape(0))
    throw std::invalid_argument("out, grad and grad_in differ in length");
  py::gil_scoped_release release;
  distgnn::relu_dropout_backward(out_data, grad_data, grad_in_data, out.shape(0), scale, num_threads);
}

// Rows of a C-contiguous array (shape[0] rows of shape[1:]) as bytes; ValueError naming it otherwise.
int64_t row_bytes_of(const py::array& a, const char* name) {
  if (a.ndim() < 1) throw std::invalid_argument(std::string(name) + " must have at least 1 dimension");
  if (!(a.flags() & py::array::c_style)) throw std::invalid_argument(std::string(name) + " must be C-contiguous");
  int64_t bytes = a.itemsize();
  for (py::ssize_t d = 1; d < a.ndim(); ++d) bytes *= a.shape(d);
  return bytes;
}

const int64_t* optional_rows(const py::object& rows, const char* name, int64_t& n) {
  if (rows.is_none()) return nullptr;
  const auto array = rows.cast<py::array>();
  const int64_t* data = vector_data<int64_t>(array, name, "int64");
  if (n >= 0 && array.shape(0) != n)
    throw std::invalid_argument(std::string(name) + " has " + std::to_string(array.shape(0)) + " entries, not " +
                                std::to_string(n));
  n = array.shape(0);
  return data;
}

void copy_rows(const py::array& src, const py::object& src_rows, py::array& dst, const py::object& dst_rows,
               int num_threads) {
  const int64_t row_bytes = row_bytes_of(src, "src");
  if (row_bytes_of(dst, "dst") != row_bytes || !src.dtype().is(dst.dtype()))
    throw std::invalid_argument("src (" + dtype_name(src) + ") and dst (" + dtype_name(dst) +
                                ") differ in dtype or row shape");
  if (!dst.writeable()) throw std::invalid_argument("dst is read-only");
  int64_t n = -1;
  const int64_t* src_index = optional_rows(src_rows, "src_rows", n);
  const int64_t* dst_index = optional_rows(dst_rows, "dst_rows", n);
  if (n < 0) n = src.shape(0);
  const char* src_data = static_cast<const char*>(src.data());
  char* dst_data = static_cast<char*>(dst.mutable_data());
  py::gil_scoped_release release;
  distgnn::copy_rows(src_data, src.shape(0), src_index, dst_data, dst.shape(0), dst_index, n, row_bytes, num_threads);
}


py::tuple temporal_sample(const py::array& indptr, const py::array& neighbors, const py::array& times,
                          const py::array& eids, const py::array& roots, const py::array& root_times, int64_t k,
                          bool uniform, uint64_t rng_seed, int num_threads) {
  const int64_t* indptr_data = vector_data<int64_t>(indptr, "indptr", "int64");
  const int64_t* neighbors_data = vector_data<int64_t>(neighbors, "neighbors", "int64");
  const double* times_data = vector_data<double>(times, "times", "float64");
  const int64_t* eids_data = vector_data<int64_t>(eids, "eids", "int64");
  const int64_t* roots_data = vector_data<int64_t>(roots, "roots", "int64");
  const double* root_times_data = vector_data<double>(root_times, "root_times", "float64");
  if (indptr.shape(0) < 1) throw std::invalid_argument("indptr must have num_nodes + 1 >= 1 entries, got 0");
  const int64_t num_entries = neighbors.shape(0), num_nodes = indptr.shape(0) - 1, num_roots = roots.shape(0);
  if (times.shape(0) != num_entries || eids.shape(0) != num_entries)
    throw std::invalid_argument("neighbors, times and eids must have one entry each per CSR position");
  if (indptr_data[0] != 0 || indptr_data[num_nodes] != num_entries)
    throw std::invalid_argument("indptr must start at 0 and end at len(neighbors) = " + std::to_string(num_entries));
  if (root_times.shape(0) != num_roots)
    throw std::invalid_argument("root_times must have one time per root (" + std::to_string(num_roots) + "), got " +
                                std::to_string(root_times.shape(0)));
  if (k < 0) throw std::invalid_argument("k must be >= 0, got " + std::to_string(k));
  py::array_t<int64_t> out_neighbors({num_roots, k}), out_eids({num_roots, k}), counts(num_roots);
  py::array_t<double> out_times({num_roots, k});
  const distgnn::TemporalCsrView csr{indptr_data, num_nodes, num_entries, neighbors_data, times_data, eids_data};
  int64_t* nbr = out_neighbors.mutable_data();
  double* when = out_times.mutable_data();
  int64_t* eid = out_eids.mutable_data();
  int64_t* count = counts.mutable_data();
  {
    py::gil_scoped_release release;
    distgnn::temporal_sample(csr, roots_data, root_times_data, num_roots, k, uniform, rng_seed, num_threads, nbr,
                             when, eid, count);
  }
  return py::make_tuple(out_neighbors, out_times, out_eids, counts);
}

// Shapes shared by the attention's forward and backward: query [R, W], kv [U, 2W], nbr, event_index and mask flat
// [R * k] (int64, int64, uint8), event [F, W], weight [R * k, heads]; W = heads * head_dim.
struct AttentionShape {
  int64_t roots, k, width, num_kv, head_dim, num_event_rows;
};

AttentionShape attention_shape(const py::array& query, const py::array& kv, const py::array& nbr,
                               const py::array& event, const py::array& event_index, const py::array& mask,
                               const py::array& weight, int64_t heads) {
  vector_data<int64_t>(nbr, "nbr", "int64");
  vector_data<int64_t>(event_index, "event_index", "int64");
  vector_data<uint8_t>(mask, "mask", "uint8");
  float_data(query, "query", 2, false);
  float_data(kv, "kv", 2, false);
  float_data(event, "event", 2, false);
  const int64_t roots = query.shape(0), width = query.shape(1);
  if (heads < 1 || width % heads != 0)
    throw std::invalid_argument("query width " + std::to_string(width) + " is not a multiple of heads " +
                                std::to_string(heads));
  const int64_t slots = nbr.shape(0), k = roots ? slots / roots : 0;
  if (k * roots != slots || mask.shape(0) != slots || event_index.shape(0) != slots)
    throw std::invalid_argument("nbr, event_index and mask must hold k entries per root (" + std::to_string(roots) +
                                " roots), got " + std::to_string(slots) + ", " +
                                std::to_string(event_index.shape(0)) + " and " + std::to_string(mask.shape(0)));
  if (kv.shape(1) != 2 * width)
    throw std::invalid_argument("kv rows must be 2 x " + std::to_string(width) + " wide, got " +
                                std::to_string(kv.shape(1)));
  if (event.shape(1) != width)
    throw std::invalid_argument("event rows must be " + std::to_string(width) + " wide, got " +
                                std::to_string(event.shape(1)));
  if (weight.ndim() != 2 || weight.shape(0) != slots || weight.shape(1) != heads)
    throw std::invalid_argument("weight must be [" + std::to_string(slots) + ", " + std::to_string(heads) + "]");
  return {roots, k, width, kv.shape(0), width / heads, event.shape(0)};
}

void temporal_attention(const py::array& query, const py::array& kv, const py::array& nbr, const py::array& event,
                        const py::array& event_index, const py::array& mask, int64_t heads, float scale,
                        const py::array& out, const py::array& weight, int num_threads) {
  const AttentionShape shape = attention_shape(query, kv, nbr, event, event_index, mask, weight, heads);
  float* out_data = float_data(out, "out", 2, true);
  float* weight_data = float_data(weight, "weight", 2, true);
  if (out.shape(0) != shape.roots || out.shape(1) != shape.width)
    throw std::invalid_argument("out must have the query's shape");
  if (shape.roots == 0) return;
  py::gil_scoped_release release;
  distgnn::temporal_attention(static_cast<const float*>(query.data()), static_cast<const float*>(kv.data()),
                              shape.num_kv, static_cast<const int64_t*>(nbr.data()),
                              static_cast<const float*>(event.data()), static_cast<const int64_t*>(event_index.data()),
                              shape.num_event_rows, static_cast<const uint8_t*>(mask.data()), shape.roots, shape.k,
                              heads, shape.head_dim, scale, out_data, weight_data, num_threads);
}

void temporal_attention_backward(const py::array& query, const py::array& kv, const py::array& nbr,
                                 const py::array& event, const py::array& event_index, const py::array& mask,
                                 const py::array& weight, const py::array& grad_out, int64_t heads, float scale,
                                 const py::array& grad_query, const py::array& grad_kv, const py::array& grad_event,
                                 int num_threads) {
  const AttentionShape shape = attention_shape(query, kv, nbr, event, event_index, mask, weight, heads);
  const float* grad_out_data = float_data(grad_out, "grad_out", 2, false);
  float* gq = float_data(grad_query, "grad_query", 2, true);
  float* gkv = float_data(grad_kv, "grad_kv", 2, true);
  float* ge = float_data(grad_event, "grad_event", 2, true);
  if (grad_out.shape(0) != shape.roots || grad_query.shape(0) != shape.roots || grad_kv.shape(0) != shape.num_kv ||
      grad_event.shape(0) != shape.num_event_rows)
    throw std::invalid_argument("gradients must have the shapes of grad_out/query, kv and event");
  if (shape.roots == 0) {
    std::fill(gkv, gkv + grad_kv.size(), 0.0f);
    std::fill(ge, ge + grad_event.size(), 0.0f);
    return;
  }
  py::gil_scoped_release release;
  distgnn::temporal_attention_backward(
      static_cast<const float*>(query.data()), static_cast<const float*>(kv.data()), shape.num_kv,
      static_cast<const int64_t*>(nbr.data()), static_cast<const float*>(event.data()),
      static_cast<const int64_t*>(event_index.data()), shape.num_event_rows, static_cast<const uint8_t*>(mask.data()),
      static_cast<const float*>(weight.data()), grad_out_data, shape.roots, shape.k, heads, shape.head_dim, scale, gq,
      gkv, ge, num_threads);
}

void sparse_adam(const py::array& weight, const py::array& state, const py::array& ids, const py::array& grad,
                 float lr, double beta1, double beta2, float eps, int num_threads) {
  float* weight_data = float_data(weight, "weight", 2, true);
  float* state_data = float_data(state, "state", 2, true);
  const int64_t* ids_data = vector_data<int64_t>(ids, "ids", "int64");
  const float* grad_data = float_data(grad, "grad", 2, false);
  const int64_t num_rows = weight.shape(0), dim = weight.shape(1), n = ids.shape(0);
  if (state.shape(0) != num_rows || state.shape(1) != 2 * dim + 1)
    throw std::invalid_argument("state must be (" + std::to_string(num_rows) + ", " + std::to_string(2 * dim + 1) +
                                ") ([m | v | t] per weight row), got (" + std::to_string(state.shape(0)) + ", " +
                                std::to_string(state.shape(1)) + ")");
  if (grad.shape(0) != n || grad.shape(1) != dim)
    throw std::invalid_argument("grad must be (" + std::to_string(n) + ", " + std::to_string(dim) +
                                ") (one row per id), got (" + std::to_string(grad.shape(0)) + ", " +
                                std::to_string(grad.shape(1)) + ")");
  py::gil_scoped_release release;
  distgnn::sparse_adam(weight_data, state_data, num_rows, dim, ids_data, n, grad_data, lr, beta1, beta2, eps,
                       num_threads);
}

}  // namespace

PYBIND11_MODULE(_cpu_kernels, m) {
  m.doc() = "distgnn CPU kernels (multi-threaded): sampling, relabel, gathers, nn ops; reached through distgnn.native.cpu.";
  m.attr("build_key") = DISTGNN_BUILD_KEY;
  m.def("sample_neighbors", &sample_neighbors, py::arg("indptr"), py::arg("indices"), py::arg("seeds"),
        py::arg("fanout"), py::arg("replace"), py::arg("prob"), py::arg("rng_seed"), py::arg("num_threads"), py::arg("return_neighbors") = false, py::arg("fanouts") = py::none(),
        "Returns (counts, positions[, neighbors]), all int64; see distgnn.sampling.kernels.sample_neighbors.");
  m.def("take", &take, py::arg("values"), py::arg("positions"), py::arg("num_threads"),
        "values[positions] as int64, gathered in parallel; ValueError on an out-of-range position.");
  m.def("copy_rows", &copy_rows, py::arg("src"), py::arg("src_rows"), py::arg("dst"), py::arg("dst_rows"),
        py::arg("num_threads"),
        "dst[dst_rows] = src[src_rows] row by row (None: rows 0..n-1), any dtype; ValueError on a bad row or shape.");
  m.def("relabel", &relabel, py::arg("dst_nids"), py::arg("src_nids_per_edge"),
        "Returns (src_nids int64, indices int64); dst ids first, then new sources by first appearance.");
  m.def("mean_aggregate", &mean_aggregate, py::arg("indptr"), py::arg("indices"), py::arg("x"), py::arg("out"),
        py::arg("mean_col"), py::arg("self_col"), py::arg("num_threads"), py::arg("average") = true,
        "Fills out[:, mean_col:+F] with the in-neighbour mean (average=False: sum) of x's rows (and out[:, "
        "self_col:+F] with x[:num_dst]).");
  m.def("mean_aggregate_tables", &mean_aggregate_tables, py::arg("indptr"), py::arg("indices"), py::arg("tables"),
        py::arg("row_table"), py::arg("row_index"), py::arg("out"), py::arg("mean_col"), py::arg("self_col"),
        py::arg("num_threads"),
        "mean_aggregate over sources whose row s is tables[row_table[s]][row_index[s]] (no copy of the rows).");
  m.def("mean_aggregate_backward", &mean_aggregate_backward, py::arg("indptr"), py::arg("indices"), py::arg("grad"),
        py::arg("mean_col"), py::arg("self_col"), py::arg("grad_x"), py::arg("num_threads"),
        "Overwrites grad_x with the gradient of mean_aggregate for the upstream gradient grad.");
  m.def("relu_dropout_mean_backward", &relu_dropout_mean_backward, py::arg("indptr"), py::arg("indices"),
        py::arg("grad"), py::arg("out"), py::arg("scale"), py::arg("grad_h"), py::arg("num_threads"),
        "Overwrites grad_h with the gradient wrt h of [out[:num_dst] | mean of out] where out = relu_dropout(h).");
  m.def("relu_dropout", &relu_dropout, py::arg("x"), py::arg("out"), py::arg("drop_threshold"), py::arg("scale"),
        py::arg("rng_seed"), py::arg("num_threads"), "out = relu(x) * keep * scale (see nn_ops.h); out may be x.");
  m.def("relu_dropout_backward", &relu_dropout_backward, py::arg("out"), py::arg("grad"), py::arg("grad_in"),
        py::arg("scale"), py::arg("num_threads"), "grad_in = grad * scale where out > 0, else 0.");
  m.def("temporal_attention", &temporal_attention, py::arg("query"), py::arg("kv"), py::arg("nbr"), py::arg("event"),
        py::arg("event_index"), py::arg("mask"), py::arg("heads"), py::arg("scale"), py::arg("out"), py::arg("weight"),
        py::arg("num_threads"), "Fused temporal attention (gather, scores, softmax, weighted sum): see temporal.h.");
  m.def("temporal_attention_backward", &temporal_attention_backward, py::arg("query"), py::arg("kv"), py::arg("nbr"),
        py::arg("event"), py::arg("event_index"), py::arg("mask"), py::arg("weight"), py::arg("grad_out"), py::arg("heads"), py::arg("scale"),
        py::arg("grad_query"), py::arg("grad_kv"), py::arg("grad_event"), py::arg("num_threads"),
        "Backward of temporal_attention.");
  m.def("temporal_sample", &temporal_sample, py::arg("indptr"), py::arg("neighbors"), py::arg("times"),
        py::arg("eids"), py::arg("roots"), py::arg("root_times"), py::arg("k"), py::arg("uniform"),
        py::arg("rng_seed"), py::arg("num_threads"),
        "Returns (neighbors [R,k] int64, times [R,k] float64, eids [R,k] int64, counts [R] int64); see "
        "distgnn.temporal.sampler.");
  m.def("sparse_adam", &sparse_adam, py::arg("weight"), py::arg("state"), py::arg("ids"), py::arg("grad"),
        py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("num_threads"),
        "Adam on weight[ids] in place, moments and step count in state ([m | v | t] rows); ids unique (see optim.h).");
}
