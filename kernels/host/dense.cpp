// Linear (GEMM), RoPE, embedding, cross-entropy and elementwise helpers on the host (CUDA twin:
// kernels/cuda/dense.cu).
#include <algorithm>
#include <optional>
#include <vector>

#include "kernels/host/common.hpp"
#include "kernels/host/gemm.hpp"
#include "kernels/host/host_kernels.hpp"
#include "kernels/kernels.hpp"

namespace hcp::kernels {
namespace {
using host::In;
using host::Out;
using host::Range;
}  // namespace

void host::linear_fwd(Tensor& y, const Tensor& x, const Tensor& W, const Tensor* bias) {
  const std::int64_t N = W.size(0), K = W.size(1);
  const std::int64_t M = x.numel() / K;
  HCP_DISPATCH_FLOAT(x, {
    In<T> x_(x, "x"), W_(W, "W");
    std::optional<In<T>> b_;
    if (bias) b_.emplace(*bias, "bias");
    Out<T> y_(y, "y");
    const T* bb = b_ ? b_->get() : nullptr;
    T* yb = y_.get();
    if (bb)
      for (std::int64_t m = 0; m < M; ++m) std::copy(bb, bb + N, yb + m * N);
    host::gemm(false, true, M, N, K, T(1), x_.get(), K, W_.get(), K, bb ? T(1) : T(0), yb, N);
  });
}

void host::linear_bwd(Tensor* dx, Tensor* dW, Tensor* dbias, const Tensor& x, const Tensor& W, const Tensor& dy) {
  const std::int64_t N = W.size(0), K = W.size(1);
  const std::int64_t M = x.numel() / K;
  HCP_DISPATCH_FLOAT(x, {
    In<T> x_(x, "x"), W_(W, "W"), dy_(dy, "dy");
    const T* xb = x_.get();
    const T* Wb = W_.get();
    const T* dyb = dy_.get();
    if (dx) {  // dx [M,K] = dy [M,N] W [N,K]
      host::require_numel(*dx, M * K, "linear_bwd: dx");
      Out<T> o(*dx, "dx");
      host::gemm(false, false, M, K, N, T(1), dyb, N, Wb, K, T(0), o.get(), K);
    }
    if (dW) {  // dW [N,K] = dy^T [N,M] x [M,K]
      host::require_numel(*dW, N * K, "linear_bwd: dW");
      Out<T> o(*dW, "dW");
      host::gemm(true, false, N, K, M, T(1), dyb, N, xb, K, T(0), o.get(), K);
    }
    if (dbias) {
      host::require_numel(*dbias, N, "linear_bwd: dbias");
      Out<T> o(*dbias, "dbias");
      T* p = o.get();
      Kokkos::parallel_for("linear_bwd_db", Range(0, N), [&](std::int64_t n) {
        T acc = 0;
        for (std::int64_t m = 0; m < M; ++m) acc += dyb[m * N + n];
        p[n] = acc;
      });
    }
  });
}

void host::rope_apply(Tensor& y, const Tensor& x, const std::vector<std::int64_t>& pos, double theta, std::int64_t rd,
                      double sign) {
  const std::int64_t Tn = x.size(0), H = x.size(1), D = x.size(2);
  HCP_DISPATCH_FLOAT(x, {
    In<T> x_(x, "x");
    Out<T> y_(y, "y");
    const T* xb = x_.get();
    T* yb = y_.get();
    const std::int64_t half = rd / 2;
    Kokkos::parallel_for("rope", Range(0, Tn * H), [&](std::int64_t w) {
      const std::int64_t t = w / H;
      const T* xr = xb + w * D;
      T* yr = yb + w * D;
      for (std::int64_t i = 0; i < half; ++i) {
        // angle in fp64 so large global positions keep their precision
        const double ang = static_cast<double>(pos[static_cast<std::size_t>(t)]) *
                           std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rd));
        const T c = static_cast<T>(std::cos(ang)), s = static_cast<T>(sign * std::sin(ang));
        const T x1 = xr[i], x2 = xr[i + half];
        yr[i] = x1 * c - x2 * s;
        yr[i + half] = x2 * c + x1 * s;
      }
      for (std::int64_t d = rd; d < D; ++d) yr[d] = xr[d];
    });
  });
}

void host::embedding_fwd(Tensor& y, const Tensor& table, const std::vector<std::int64_t>& ids) {
  const std::int64_t C = table.size(1), Tn = static_cast<std::int64_t>(ids.size());
  HCP_DISPATCH_FLOAT(table, {
    In<T> t_(table, "table");
    Out<T> y_(y, "y");
    const T* tb = t_.get();
    T* yb = y_.get();
    Kokkos::parallel_for("embedding_fwd", Range(0, Tn), [&](std::int64_t t) {
      std::copy(tb + ids[static_cast<std::size_t>(t)] * C, tb + (ids[static_cast<std::size_t>(t)] + 1) * C, yb + t * C);
    });
  });
}

void host::embedding_bwd(Tensor& dtable, const std::vector<std::int64_t>& ids, const Tensor& dy) {
  const std::int64_t V = dtable.size(0), C = dtable.size(1), Tn = static_cast<std::int64_t>(ids.size());
  // CSR of token lists per vocabulary row: each row is then summed by one work item, in token order.
  std::vector<std::int64_t> start(static_cast<std::size_t>(V + 1), 0), order(static_cast<std::size_t>(Tn));
  for (auto id : ids) start[static_cast<std::size_t>(id + 1)]++;
  for (std::int64_t v = 0; v < V; ++v) start[static_cast<std::size_t>(v + 1)] += start[static_cast<std::size_t>(v)];
  std::vector<std::int64_t> fill(start.begin(), start.end() - 1);
  for (std::int64_t t = 0; t < Tn; ++t)
    order[static_cast<std::size_t>(fill[static_cast<std::size_t>(ids[static_cast<std::size_t>(t)])]++)] = t;
  HCP_DISPATCH_FLOAT(dy, {
    In<T> dy_(dy, "dy");
    Out<T> dt_(dtable, "dtable");
    const T* dyb = dy_.get();
    T* db = dt_.get();
    Kokkos::parallel_for("embedding_bwd", Range(0, V), [&](std::int64_t v) {
      T* row = db + v * C;
      for (std::int64_t c = 0; c < C; ++c) row[c] = 0;
      for (std::int64_t e = start[static_cast<std::size_t>(v)]; e < start[static_cast<std::size_t>(v + 1)]; ++e) {
        const std::int64_t t = order[static_cast<std::size_t>(e)];
        for (std::int64_t c = 0; c < C; ++c) row[c] += dyb[t * C + c];
      }
    });
  });
}

double host::cross_entropy_fwd(const Tensor& logits, const std::vector<std::int64_t>& labels, std::int64_t ignore,
                               std::int64_t* count) {
  const std::int64_t Tn = logits.size(0), V = logits.size(1);
  std::vector<double> loss(static_cast<std::size_t>(Tn), 0.0);
  HCP_DISPATCH_FLOAT(logits, {
    In<T> l_(logits, "logits");
    const T* lb = l_.get();
    Kokkos::parallel_for("cross_entropy_fwd", Range(0, Tn), [&](std::int64_t t) {
      const std::int64_t lab = labels[static_cast<std::size_t>(t)];
      if (lab == ignore) return;
      T mx = -std::numeric_limits<T>::infinity();
      for (std::int64_t v = 0; v < V; ++v) mx = std::max(mx, lb[t * V + v]);
      T s = 0;
      for (std::int64_t v = 0; v < V; ++v) s += std::exp(lb[t * V + v] - mx);
      loss[static_cast<std::size_t>(t)] = static_cast<double>(mx + std::log(s) - lb[t * V + lab]);
    });
  });
  double sum = 0;
  std::int64_t n = 0;
  for (std::int64_t t = 0; t < Tn; ++t) {
    if (labels[static_cast<std::size_t>(t)] == ignore) continue;
    sum += loss[static_cast<std::size_t>(t)];
    ++n;
  }
  if (count) *count = n;
  return sum;
}

void host::cross_entropy_bwd(Tensor& dlogits, const Tensor& logits, const std::vector<std::int64_t>& labels,
                             std::int64_t ignore, double scale) {
  const std::int64_t Tn = logits.size(0), V = logits.size(1);
  HCP_DISPATCH_FLOAT(logits, {
    In<T> l_(logits, "logits");
    Out<T> d_(dlogits, "dlogits");
    const T* lb = l_.get();
    T* db = d_.get();
    Kokkos::parallel_for("cross_entropy_bwd", Range(0, Tn), [&](std::int64_t t) {
      const std::int64_t lab = labels[static_cast<std::size_t>(t)];
      T* row = db + t * V;
      if (lab == ignore) {
        for (std::int64_t v = 0; v < V; ++v) row[v] = 0;
        return;
      }
      T mx = -std::numeric_limits<T>::infinity();
      for (std::int64_t v = 0; v < V; ++v) mx = std::max(mx, lb[t * V + v]);
      T s = 0;
      for (std::int64_t v = 0; v < V; ++v) s += std::exp(lb[t * V + v] - mx);
      for (std::int64_t v = 0; v < V; ++v)
        row[v] = static_cast<T>(scale) * (std::exp(lb[t * V + v] - mx) / s - (v == lab ? T(1) : T(0)));
    });
  });
}

void host::add(Tensor& y, const Tensor& a, const Tensor& b) {
  HCP_DISPATCH_FLOAT(a, {
    In<T> a_(a, "a"), b_(b, "b");
    Out<T> y_(y, "y");
    const T* ab = a_.get();
    const T* bb = b_.get();
    T* yb = y_.get();
    Kokkos::parallel_for("add", Range(0, a.numel()), [&](std::int64_t i) { yb[i] = ab[i] + bb[i]; });
  });
}

void host::axpy(Tensor& y, double alpha, const Tensor& x) {
  HCP_DISPATCH_FLOAT(y, {
    In<T> x_(x, "x");
    Out<T> y_(y, "y", true);
    const T* xb = x_.get();
    T* yb = y_.get();
    const T al = static_cast<T>(alpha);
    Kokkos::parallel_for("axpy", Range(0, x.numel()), [&](std::int64_t i) { yb[i] += al * xb[i]; });
  });
}

}  // namespace hcp::kernels
