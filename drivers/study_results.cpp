// Study's results: each case's tensors against the reference (gathered in global order, the pads
// checked to be zero), and the results and inputs written to the file as the real tokens in global
// order.
#include <cmath>

#include "cp/layout.hpp"
#include "study.hpp"

namespace hcp::drivers {

void Study::Errors::add(const std::string& name, double e) {
  rel.emplace_back(name, e);
  worst = nan_max(worst, e);
}
void Study::compare(Errors& e, const std::string& name, const Tensor& got, const Tensor& ref) const {
  if (!check || !root()) return;
  const ErrorStats s = hcp::compare(got, ref);
  if (!norm_wise)
    e.add(name, s.max_abs / std::max(s.ref_max, 1e-300));
  else
    e.add(name, s.nonfinite > 0 ? INFINITY : std::sqrt(s.sq_diff) / std::max(std::sqrt(s.sq_ref), 1e-300));
}
double Study::max_abs(const Tensor& t) {
  const Tensor h = host(t);
  double mx = 0;
  for (std::int64_t i = 0; i < h.numel(); ++i) mx = nan_max(mx, std::abs(h.get(i)));
  return mx;
}

void Study::pad_error(Errors& e, const std::string& name, double max_pad, const Tensor& ref) const {
  const ErrorStats r = hcp::compare(ref, Tensor::zeros(ref.shape(), ref.dtype()));
  e.add(name + "_pads", max_pad / std::max(r.max_abs, 1e-300));
}

void Study::result(Errors& e, const std::string& name, const std::string& path, const Tensor& local_in,
                   const Tensor& ref, bool pads_zero, const std::string& layout, const std::string& units) {
  const Tensor local = planted(local_in);
  if (check) {
    compare(e, name, host(placement.gather_real(comm, local)), ref);
    if (pads_zero && (placement.by_documents() || placement.global.padded())) {
      std::vector<std::int64_t> pads;  // this rank's pad rows
      const std::vector<std::int64_t> rows = local_rows();
      for (std::size_t i = 0; i < rows.size(); ++i)
        if (rows[i] < 0) pads.push_back(static_cast<std::int64_t>(i));
      const double mx = comm.all_reduce_scalar(max_abs(cp::take_rows(local, pads)), ReduceOp::Max);
      if (root()) pad_error(e, name, mx, ref);
    }
  }
  cross_compare(e, name, local, true);
  if (writer_) write_real_rows(path, local, layout, units);
}

void Study::write_real_rows(const std::string& path, const Tensor& local, const std::string& layout,
                            const std::string& units) {
  // Row of each local token in the file: its index among the real tokens in global order; -1 for a
  // pad and on the ranks of other CP groups (data-parallel replicas hold the same rows).
  std::vector<std::int64_t> rows = local_rows();
  if (grid.dp_rank != 0) rows.assign(rows.size(), -1);
  writer_->rows(path, local, rows, placement.global.unpadded().total(), layout, units);
}

void Study::input(const std::string& name, const Tensor& local, const std::string& layout, const std::string& units) {
  if (keeps_inputs()) write_real_rows("/inputs/" + name, host(local), layout, units);
}

void Study::input_whole(const std::string& name, const Tensor& t, const std::string& layout, const std::string& units) {
  if (keeps_inputs()) writer_->tensor("/inputs/" + name, host(t), layout, units);
}

void Study::input_layout() {
  if (!keeps_inputs()) return;
  const std::vector<std::int64_t> cu = placement.global.unpadded().cu_seqlens;
  const std::vector<double> v(cu.begin(), cu.end());
  writer_->tensor("/inputs/cu_seqlens", Tensor::from(v, {static_cast<std::int64_t>(v.size())}, DType::F64),
                  "[sequences+1] start of each sequence, real tokens", "tokens");
}

}  // namespace hcp::drivers
