// run.check = "cross": each case's results against the first case's, shard by shard on each rank,
// and run.plant_fault, the perturbation that shows a check fails.
#include <algorithm>
#include <cmath>

#include "cp/layout.hpp"
#include "study.hpp"

namespace hcp::drivers {

Tensor Study::planted(const Tensor& local) {
  if (planted_ || case_.empty() || deck.get_string("run.plant_fault") != case_ || local.numel() == 0) return local;
  planted_ = true;
  Tensor t = host(local).clone();
  // One element of the first row moves, on every rank, by 10x the rank's 2-norm of the result: over
  // the group the moved elements' norm is 10x the result's, and the largest move is over 10x its
  // largest magnitude, so both error metrics exceed 1 whatever the dtype's tolerance.
  double sq = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) sq += t.get(i) * t.get(i);
  t.set(0, t.get(0) + 10.0 * (sq > 0 ? std::sqrt(sq) : 1.0));
  return t;
}

void Study::cross_compare(Errors& e, const std::string& name, const Tensor& local_in, bool batch_rows) {
  if (!cross) return;
  Tensor local = host(planted(local_in));
  if (batch_rows) {  // this rank's real rows (pads are not results)
    std::vector<std::int64_t> keep;
    const std::vector<std::int64_t> idx = local_rows();
    for (std::size_t i = 0; i < idx.size(); ++i)
      if (idx[i] >= 0) keep.push_back(static_cast<std::int64_t>(i));
    if (static_cast<std::int64_t>(keep.size()) != local.size(0)) local = cp::take_rows(local, keep);
  }
  const auto it = first_.find(name);
  if (it == first_.end()) {
    first_[name] = local.clone();
    return;
  }
  cross_compared_ = true;
  const ErrorStats st = hcp::compare(local, it->second);
  // One all-reduce: maxima for the max-norm error, sums for the norm-wise one.
  double v[3] = {norm_wise ? st.sq_diff : st.max_abs, norm_wise ? st.sq_ref : st.ref_max,
                 static_cast<double>(st.nonfinite)};
  comm.all_reduce(v, 3, DType::F64, norm_wise ? ReduceOp::Sum : ReduceOp::Max);
  const double err = norm_wise ? std::sqrt(v[0]) / std::max(std::sqrt(v[1]), 1e-300) : v[0] / std::max(v[1], 1e-300);
  e.add(name, v[2] > 0 ? INFINITY : err);
}

void Study::cross_scalar(Errors& e, const std::string& name, double v) {
  if (!cross) return;
  const auto it = first_scalar_.find(name);
  if (it == first_scalar_.end()) {
    first_scalar_[name] = v;
    return;
  }
  cross_compared_ = true;
  e.add(name, std::isfinite(v) ? std::abs(v - it->second) / std::max(std::abs(it->second), 1e-300) : INFINITY);
}

}  // namespace hcp::drivers
