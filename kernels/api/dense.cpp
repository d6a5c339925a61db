// The kernel API for linear, RoPE, embedding, cross-entropy and elementwise ops: each entry point checks its shapes,
// then routes the call by the tensors' memory space (kernels/api/route.hpp).
#include <vector>

#include "kernels/api/route.hpp"
#include "kernels/kernels.hpp"
#include "kernels/shape_rules.hpp"

namespace hcp::kernels {
using rules::check_ce;
using rules::require_numel;

void linear_fwd(Tensor& y, const Tensor& x, const Tensor& W, const Tensor* bias) {
  HCP_CHECK(W.dim() == 2, "linear: weight must be [N,K], got ", shape_str(W.shape()));
  const std::int64_t N = W.size(0), K = W.size(1);
  HCP_CHECK(K > 0 && x.numel() % K == 0, "linear: x ", shape_str(x.shape()), " is not [M, K=", K, "]");
  const std::int64_t M = x.numel() / K;
  require_numel(y, M * N, "linear_fwd: y [M,N]");
  if (bias) require_numel(*bias, N, "linear: bias [N]");
  HCP_ROUTE(x, linear_fwd, y, x, W, bias);
}

void linear_bwd(Tensor* dx, Tensor* dW, Tensor* dbias, const Tensor& x, const Tensor& W, const Tensor& dy) {
  HCP_CHECK(W.dim() == 2, "linear: weight must be [N,K], got ", shape_str(W.shape()));
  const std::int64_t N = W.size(0), K = W.size(1);
  HCP_CHECK(K > 0 && x.numel() % K == 0, "linear: x ", shape_str(x.shape()), " is not [M, K=", K, "]");
  const std::int64_t M = x.numel() / K;
  require_numel(dy, M * N, "linear_bwd: dy [M,N]");
  HCP_ROUTE(x, linear_bwd, dx, dW, dbias, x, W, dy);
}

namespace {
void rope_apply(Tensor& y, const Tensor& x, const std::vector<std::int64_t>& pos, double theta, std::int64_t rd,
                double sign) {
  HCP_CHECK(x.dim() == 3, "rope: x must be [T,H,D], got ", shape_str(x.shape()));
  const std::int64_t Tn = x.size(0), D = x.size(2);
  HCP_CHECK(rd > 0 && rd <= D && rd % 2 == 0, "rope: rotary_dim (", rd, ") must be even and in (0, head_dim=", D, "]");
  HCP_CHECK(static_cast<std::int64_t>(pos.size()) == Tn, "rope: ", pos.size(), " positions for ", Tn, " tokens");
  HCP_CHECK(theta > 0, "rope: theta must be > 0");
  require_numel(y, x.numel(), "rope: y");
  HCP_ROUTE(x, rope_apply, y, x, pos, theta, rd, sign);
}
}  // namespace

void rope_fwd(Tensor& y, const Tensor& x, const std::vector<std::int64_t>& positions, double theta,
              std::int64_t rotary_dim) {
  rope_apply(y, x, positions, theta, rotary_dim, 1.0);
}
void rope_bwd(Tensor& dx, const Tensor& dy, const std::vector<std::int64_t>& positions, double theta,
              std::int64_t rotary_dim) {
  rope_apply(dx, dy, positions, theta, rotary_dim, -1.0);
}

void embedding_fwd(Tensor& y, const Tensor& table, const std::vector<std::int64_t>& ids) {
  HCP_CHECK(table.dim() == 2, "embedding: table must be [V,C], got ", shape_str(table.shape()));
  const std::int64_t V = table.size(0), C = table.size(1), Tn = static_cast<std::int64_t>(ids.size());
  require_numel(y, Tn * C, "embedding_fwd: y [T,C]");
  for (auto id : ids) HCP_CHECK(id >= 0 && id < V, "embedding: token id ", id, " outside the vocabulary [0, ", V, ")");
  HCP_ROUTE(table, embedding_fwd, y, table, ids);
}

void embedding_bwd(Tensor& dtable, const std::vector<std::int64_t>& ids, const Tensor& dy) {
  HCP_CHECK(dtable.dim() == 2, "embedding: dtable must be [V,C]");
  const std::int64_t V = dtable.size(0), C = dtable.size(1), Tn = static_cast<std::int64_t>(ids.size());
  require_numel(dy, Tn * C, "embedding_bwd: dy [T,C]");
  for (auto id : ids) HCP_CHECK(id >= 0 && id < V, "embedding: token id ", id, " outside the vocabulary [0, ", V, ")");
  HCP_ROUTE(dy, embedding_bwd, dtable, ids, dy);
}

double cross_entropy_fwd(const Tensor& logits, const std::vector<std::int64_t>& labels, std::int64_t ignore,
                         std::int64_t* count) {
  check_ce(logits, labels, ignore);
  return HCP_ROUTE(logits, cross_entropy_fwd, logits, labels, ignore, count);
}

void cross_entropy_bwd(Tensor& dlogits, const Tensor& logits, const std::vector<std::int64_t>& labels,
                       std::int64_t ignore, double scale) {
  check_ce(logits, labels, ignore);
  require_numel(dlogits, logits.numel(), "cross_entropy_bwd: dlogits");
  HCP_ROUTE(logits, cross_entropy_bwd, dlogits, logits, labels, ignore, scale);
}

void add(Tensor& y, const Tensor& a, const Tensor& b) {
  HCP_CHECK(a.numel() == b.numel(), "add: ", shape_str(a.shape()), " + ", shape_str(b.shape()));
  require_numel(y, a.numel(), "add: y");
  HCP_ROUTE(a, add, y, a, b);
}

void axpy(Tensor& y, double alpha, const Tensor& x) {
  require_numel(y, x.numel(), "axpy: y");
  HCP_ROUTE(x, axpy, y, alpha, x);
}

}  // namespace hcp::kernels
