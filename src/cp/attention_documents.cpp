// CpAttention on a per-document placement (cp/documents.hpp): whole documents attended locally,
// the split ones as a CP problem of their own.
#include "cp/attention_cp.hpp"

namespace hcp::cp {
namespace k = hcp::kernels;

// Rows [0, W) hold whole documents: the kernels on them alone, nothing sent. Rows [W, Tl) are this
// rank's chunks of the split documents: their own CP attention (any strategy) on those rows.
CpAttnConfig split_documents_config(const CpAttnConfig& cfg) {
  HCP_CHECK(cfg.docs, "split_documents_config: no per-document placement");
  CpAttnConfig s = cfg;
  s.global = cfg.docs->split;
  s.docs = nullptr;
  return s;
}

void CpAttention::fwd_docs(Tensor& o) {
  PhaseTimes& c = fwd_ph_;
  c.start_laps(q_.space());
  const std::int64_t W = local_.total(), S = tl_ - W;
  o_ = Tensor::zeros(q_.shape(), q_.dtype());
  lse_ = Tensor::zeros({tl_, cfg_.heads}, q_.dtype() == DType::F64 ? DType::F64 : DType::F32);
  if (W > 0) {
    auto p = base_params(cfg_.heads, cfg_.kv_heads);
    p.segments = k::segments_from_layout(local_, local_);
    Tensor ow = o_.slice(0, 0, W), lw = lse_.slice(0, 0, W);
    k::attention_fwd(ow, lw, q_.slice(0, 0, W), k_.slice(0, 0, W), v_.slice(0, 0, W), p);
  }
  c.lap("compute");
  if (split_) {
    Tensor os = o_.slice(0, W, S);
    split_->forward(os, q_.slice(0, W, S), k_.slice(0, W, S), v_.slice(0, W, S));
  }
  o.copy_from(o_.view(o.shape()));
}

void CpAttention::bwd_docs(Tensor& dq, Tensor& dk, Tensor& dv, const Tensor& dout) {
  PhaseTimes& c = bwd_ph_;
  c.start_laps(q_.space());
  const std::int64_t W = local_.total(), S = tl_ - W;
  Tensor dql = Tensor::zeros(q_.shape(), q_.dtype()), dkl = Tensor::zeros(k_.shape(), k_.dtype()),
         dvl = Tensor::zeros(v_.shape(), v_.dtype());
  if (W > 0) {
    auto p = base_params(cfg_.heads, cfg_.kv_heads);
    p.segments = k::segments_from_layout(local_, local_);
    Tensor a = dql.slice(0, 0, W), b = dkl.slice(0, 0, W), d = dvl.slice(0, 0, W);
    k::attention_bwd(a, b, d, q_.slice(0, 0, W), k_.slice(0, 0, W), v_.slice(0, 0, W), o_.slice(0, 0, W),
                     lse_.slice(0, 0, W), dout.slice(0, 0, W), p);
  }
  c.lap("compute");
  if (split_) {
    Tensor a = dql.slice(0, W, S), b = dkl.slice(0, W, S), d = dvl.slice(0, W, S);
    split_->backward(a, b, d, dout.slice(0, W, S));
  }
  dq.copy_from(dql.view(dq.shape()));
  dk.copy_from(dkl.view(dk.shape()));
  dv.copy_from(dvl.view(dv.shape()));
}

}  // namespace hcp::cp
