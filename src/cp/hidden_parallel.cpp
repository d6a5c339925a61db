#include "cp/hidden_parallel.hpp"

#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace hcp::cp {
namespace k = hcp::kernels;

HpShare HpShare::of(std::int64_t heads, std::int64_t groups, int cp, int rank) {
  HCP_CHECK(heads % cp == 0, "hidden-parallel Mamba CP needs mamba.heads (", heads, ") divisible by cp (", cp, ")");
  HpShare s;
  if (groups >= cp) {
    HCP_CHECK(groups % cp == 0, "hidden-parallel Mamba CP needs mamba.n_groups (", groups, ") divisible by cp (", cp,
              ") when n_groups >= cp");
    s.gl = groups / cp;
  } else {
    HCP_CHECK(cp % groups == 0, "hidden-parallel Mamba CP with mamba.n_groups (", groups, ") < cp (", cp,
              ") repeats groups and needs cp % n_groups == 0");
    s.rep = cp / groups;
    s.gl = 1;
  }
  s.hl = heads / cp;
  s.h0 = rank * s.hl;
  s.g0 = s.rep > 1 ? rank / s.rep : rank * s.gl;
  return s;
}

std::vector<HpSlice> hp_slices(const HpShare& s, std::int64_t Di, std::int64_t G, std::int64_t N, std::int64_t P) {
  // conv_w / conv_b rows: [x: Di][B: G*N][C: G*N].
  return {{"conv_wx", "conv_w", s.h0 * P, s.hl * P},
          {"conv_bx", "conv_b", s.h0 * P, s.hl * P},
          {"conv_wB", "conv_w", Di + s.g0 * N, s.gl * N},
          {"conv_bB", "conv_b", Di + s.g0 * N, s.gl * N},
          {"conv_wC", "conv_w", Di + G * N + s.g0 * N, s.gl * N},
          {"conv_bC", "conv_b", Di + G * N + s.g0 * N, s.gl * N},
          {"A_log", "A_log", s.h0, s.hl},
          {"D", "D", s.h0, s.hl},
          {"dt_bias", "dt_bias", s.h0, s.hl}};
}

std::map<std::string, Tensor> take_slices(const std::vector<HpSlice>& slices,
                                          const std::map<std::string, Tensor>& params) {
  std::map<std::string, Tensor> out;
  for (const HpSlice& s : slices) out[s.name] = params.at(s.param).slice(0, s.row0, s.rows).clone();
  return out;
}

void add_slice_grads(std::map<std::string, Tensor>& grads, const std::vector<HpSlice>& slices,
                     const std::map<std::string, Tensor>& slice_grads) {
  for (const HpSlice& s : slices) {
    Tensor dst = grads[s.param].slice(0, s.row0, s.rows);
    Tensor sum = dst.clone();
    k::axpy(sum, 1.0, slice_grads.at(s.name));
    dst.copy_from(sum);
  }
}

Tensor repeat_groups(const Tensor& x, std::int64_t G, std::int64_t N, std::int64_t rep) {
  if (rep == 1) return x;
  const std::int64_t t = x.size(0);
  Tensor out = Tensor::empty({t, G * rep * N}, x.dtype());
  for (std::int64_t e = 0; e < G * rep; ++e) out.slice(1, e * N, N).copy_from(x.slice(1, (e / rep) * N, N));
  return out;
}
Tensor sum_groups(const Tensor& x, std::int64_t G, std::int64_t N, std::int64_t rep) {
  if (rep == 1) return x;
  const std::int64_t t = x.size(0);
  Tensor out = Tensor::zeros({t, G * N}, x.dtype());
  for (std::int64_t e = 0; e < G * rep; ++e) {
    Tensor d = out.slice(1, (e / rep) * N, N).clone();
    k::axpy(d, 1.0, x.slice(1, e * N, N).clone());
    out.slice(1, (e / rep) * N, N).copy_from(d);
  }
  return out;
}

Tensor cols(const Tensor& x, std::int64_t c0, std::int64_t n) { return x.slice(1, c0, n).clone(); }

}  // namespace hcp::cp
