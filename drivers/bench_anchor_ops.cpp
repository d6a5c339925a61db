// The anchor shapes of bench_kernels (GPU only).
#include <algorithm>
#include <initializer_list>

#include "bench_ops.hpp"
#include "kernels/kernels.hpp"
#ifdef HCP_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.hpp"
#endif

namespace hcp::drivers {
namespace k = hcp::kernels;

// The anchor shapes (GPU only). Inputs are made only for the groups whose op names `only`
// matches (filling them all on the host takes minutes).
void anchor_ops(std::vector<Op>& ops, const Maker& T_, DType dt, const std::string& only,
                const std::vector<k::AttnBwdKernel>& bwd_forms) {
  const double es = static_cast<double>(dtype_size(dt));
  const auto want = [&only](std::initializer_list<std::string> names) {
    return only.empty() || std::any_of(names.begin(), names.end(),
                                       [&](const std::string& n) { return n.find(only) != std::string::npos; });
  };
  // Causal attention of B sequences of L tokens, H query heads on Hkv kv heads of D. Shape tags name
  // the kv heads only under GQA (`_b1h32g2l8192d128`).
  auto attention = [&](std::int64_t B, std::int64_t H, std::int64_t Hkv, std::int64_t L, std::int64_t D, bool bwd) {
    const std::string tag = "_b" + std::to_string(B) + "h" + std::to_string(H) +
                            (Hkv == H ? "" : "g" + std::to_string(Hkv)) + "l" + std::to_string(L) + "d" +
                            std::to_string(D);
    if (!want({"attention_fwd" + tag, bwd ? "attention_bwd" + tag : "attention_fwd" + tag})) return;
    auto q = T_({B, L, H, D}, 1, -1, 1), kk = T_({B, L, Hkv, D}, 2, -1, 1), v = T_({B, L, Hkv, D}, 3, -1, 1),
         o = T_({B, L, H, D}, 0, 0, 0);
    // The log-sum-exp is fp32 for bf16 inputs (fp64 for fp64).
    auto lse = std::make_shared<Tensor>(Tensor::zeros({B * L, H}, acc_dtype(dt), q->space()));
    auto p = std::make_shared<k::AttnParams>();
    p->heads = H;
    p->kv_heads = Hkv;
    p->head_dim = D;
    p->segments = k::segments_from_layout(SeqLayout::bshd(B, L), SeqLayout::bshd(B, L));
    const double f = 4.0 * B * H * L * L * D / 2;  // causal
    const std::string shp = "B=" + std::to_string(B) + " H=" + std::to_string(H) +
                            (Hkv == H ? "" : "/" + std::to_string(Hkv)) + " L=" + std::to_string(L) +
                            " D=" + std::to_string(D) + " causal";
    ops.push_back({"attention_fwd" + tag, shp, f, 0, [=] { k::attention_fwd(*o, *lse, *q, *kk, *v, *p); }});
    if (!bwd) return;
    auto dq = T_({B, L, H, D}, 0, 0, 0), dk = T_({B, L, Hkv, D}, 0, 0, 0), dv = T_({B, L, Hkv, D}, 0, 0, 0);
    for (const k::AttnBwdKernel form : bwd_forms) {
      auto pf = std::make_shared<k::AttnParams>(*p);
      pf->bwd_kernel = form;
      const std::string suffix = form == k::AttnBwdKernel::Auto ? "" : std::string(".") + k::to_string(form);
      ops.push_back({"attention_bwd" + tag + suffix, shp, 2.5 * f, 0,
                     [=] { k::attention_bwd(*dq, *dk, *dv, *q, *kk, *v, *o, *lse, *o, *pf); }});
    }
  };
  attention(2, 16, 16, 8192, 128, true);
  attention(4, 32, 32, 4096, 64, true);
  attention(1, 16, 16, 32768, 128, false);
  // The hybrid model's attention (Nemotron-3-Nano: 32 query heads on 2 kv heads) at long lengths.
  for (const std::int64_t D : {128, 64})
    for (const std::int64_t L : {8192, 32768, 131072}) attention(1, 32, 2, L, D, true);
  if (want({"ssd_fwd", "ssd_bwd", "ssd_run_decay", "ssd_init_state_fwd",
            "ssd_init_state_bwd"})) {  // Mamba2 SSD and state passing's terms, the anchor shape
    auto p = std::make_shared<k::SsdParams>();
    p->batch = 2;
    p->seqlen = 8192;
    p->heads = 128;
    p->head_dim = 64;
    p->groups = 8;
    p->d_state = 128;
    p->chunk = 128;
    const std::int64_t B = 2, L = 8192, H = 128, P = 64, G = 8, N = 128;
    auto x = T_({B, L, H, P}, 10, -1, 1), dt_ = T_({B, L, H}, 11, -4, -1), A = T_({H}, 12, 0, 1),
         Bm = T_({B, L, G, N}, 13, -1, 1), C = T_({B, L, G, N}, 14, -1, 1), D = T_({H}, 15, -1, 1),
         db = T_({H}, 16, -0.5, 0.5), y = T_({B, L, H, P}, 0, 0, 0);
    auto dx = T_({B, L, H, P}, 0, 0, 0), ddt = T_({B, L, H}, 0, 0, 0), dA = T_({H}, 0, 0, 0),
         dB = T_({B, L, G, N}, 0, 0, 0), dC = T_({B, L, G, N}, 0, 0, 0), dD = T_({H}, 0, 0, 0), ddb = T_({H}, 0, 0, 0);
    auto in = std::make_shared<k::SsdInputs>(
        k::SsdInputs{x.get(), dt_.get(), A.get(), Bm.get(), C.get(), D.get(), db.get(), nullptr, nullptr});
    auto g = std::make_shared<k::SsdGrads>(
        k::SsdGrads{dx.get(), ddt.get(), dA.get(), dB.get(), dC.get(), dD.get(), ddb.get(), nullptr});
    const std::string shp = "b=2 L=8192 H=128 P=64 G=8 N=128 chunk=128";
    const double bytes = es * (2.0 * B * L * H * P + 2.0 * B * L * G * N + B * L * H);
    ops.push_back({"ssd_fwd", shp, 0, bytes, [=] { k::ssd_fwd(*y, nullptr, *in, *p); }});
    ops.push_back({"ssd_bwd", shp, 0, 2 * bytes, [=] { k::ssd_bwd(*g, *in, *y, nullptr, *p); }});
    state_passing_ops(ops, T_, *in, *p, {dC.get(), ddt.get(), dA.get(), ddb.get(), nullptr}, shp);
  }
#ifdef HCP_HAVE_CUDA
  if (want({"grouped_gemm", "dense_gemm_same_flops",
            "expert_mlp_fwd"})) {  // MoE expert GEMM: 128 experts, top-6, hidden 2688, FFN 1856, 16k tokens, uneven
                                   // counts
    const std::int64_t E = 128, T = 16384, K = 6, C = 2688, F = 1856, rows = T * K;
    auto counts = std::make_shared<std::vector<std::int64_t>>();
    std::int64_t wsum = 0;
    for (std::int64_t e = 0; e < E; ++e) wsum += 1 + (e * 37) % 11;
    std::int64_t used = 0;
    for (std::int64_t e = 0; e < E; ++e) {
      const std::int64_t c = e + 1 == E ? rows - used : rows * (1 + (e * 37) % 11) / wsum;
      counts->push_back(c);
      used += c;
    }
    auto x = T_({rows, C}, 50, -1, 1), W1 = T_({E, F, C}, 51, -0.05, 0.05), h = T_({rows, F}, 0, 0, 0);
    auto desc = std::make_shared<std::vector<kernels::cuda_impl::GemmGroupDesc>>();
    std::int64_t r0 = 0;
    const std::size_t esz = dtype_size(dt);
    for (std::int64_t e = 0; e < E; ++e) {
      desc->push_back({static_cast<char*>(x->raw()) + static_cast<std::size_t>(r0 * C) * esz,
                       static_cast<char*>(W1->raw()) + static_cast<std::size_t>(e * F * C) * esz,
                       static_cast<char*>(h->raw()) + static_cast<std::size_t>(r0 * F) * esz,
                       (*counts)[static_cast<std::size_t>(e)], F, C, C, C, F});
      r0 += (*counts)[static_cast<std::size_t>(e)];
    }
    const double f = 2.0 * rows * C * F;
    ops.push_back({"grouped_gemm", "E=128 rows=98304 (uneven) K=2688 N=1856", f, 0,
                   [=] { kernels::cuda_impl::grouped_gemm(false, true, *desc, dt); }});
    auto Wd = T_({F, C}, 52, -0.05, 0.05);
    ops.push_back({"dense_gemm_same_flops", "M=98304 K=2688 N=1856 (cuBLAS)", f, 0,
                   [=] { k::linear_fwd(*h, *x, *Wd, nullptr); }});
    auto W2 = T_({E, C, F}, 53, -0.05, 0.05), yp = T_({rows, C}, 0, 0, 0);
    ops.push_back({"expert_mlp_fwd", "E=128 rows=98304 C=2688 F=1856 sqrelu", 2 * f, 0,
                   [=] { k::expert_mlp_fwd(*yp, *h, *x, *W1, *W2, *counts, k::Activation::SquaredReLU); }});
  }
#endif
  if (want({"rmsnorm_fwd", "conv1d_fwd", "rope_fwd", "device_copy"})) {  // memory-bound kernels and the copy ceiling
    const std::int64_t M = 16384, Cn = 4096;
    auto x = T_({M, Cn}, 30, -1, 1), w = T_({Cn}, 31, 0.5, 1.5), y = T_({M, Cn}, 0, 0, 0), r = T_({M}, 0, 0, 0);
    ops.push_back({"rmsnorm_fwd", "M=16384 C=4096", 0, es * 2 * M * Cn, [=] { k::rmsnorm_fwd(*y, *r, *x, *w, 1e-5); }});
    const std::int64_t L = 8192, Cc = 10240;
    auto xc = T_({2, L, Cc}, 20, -1, 1), wc = T_({Cc, 4}, 21, -1, 1), bc = T_({Cc}, 22, -1, 1),
         yc = T_({2, L, Cc}, 0, 0, 0);
    ops.push_back({"conv1d_fwd", "B=2 L=8192 C=10240 W=4 silu", 0, es * 2 * 2 * L * Cc,
                   [=] { k::conv1d_fwd(*yc, *xc, *wc, bc.get(), nullptr, true); }});
    const std::int64_t Tn = 16384;
    auto xr = T_({Tn, 32, 128}, 40, -1, 1), yr = T_({Tn, 32, 128}, 0, 0, 0);
    auto pos = std::make_shared<std::vector<std::int64_t>>();
    for (std::int64_t t = 0; t < Tn; ++t) pos->push_back(t);
    ops.push_back({"rope_fwd", "T=16384 H=32 D=128", 0, es * 2 * Tn * 32 * 128,
                   [=] { k::rope_fwd(*yr, *xr, *pos, 10000.0, 128); }});
    auto big = T_({M, Cn * 4}, 60, -1, 1), dst = T_({M, Cn * 4}, 0, 0, 0);
    ops.push_back({"device_copy", "256 Mi elements", 0, es * 2 * M * Cn * 4, [=] { dst->copy_from(*big); }});
  }
}

}  // namespace hcp::drivers
