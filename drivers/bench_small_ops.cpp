// The small suite of bench_kernels: every kernel on small, documented shapes.
#include <algorithm>
#include <initializer_list>

#include "bench_ops.hpp"
#include "kernels/host/gemm.hpp"
#include "kernels/kernels.hpp"
#ifdef HCP_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.hpp"
#endif

namespace hcp::drivers {
namespace k = hcp::kernels;

// Seed 0 with lo == hi == 0 asks for zeros, made where they live (no host fill and copy: the anchor
// suite's tensors hold billions of elements).
Tensor bench_tensor(const Shape& s, DType dt, std::uint64_t seed, double lo, double hi, Space sp) {
  if (seed == 0 && lo == 0 && hi == 0) return Tensor::zeros(s, dt, sp);
  Tensor t = Tensor::empty(s, dt, Space::Host);
  fill_uniform(t, seed, lo, hi);
  return sp == Space::Host ? t : t.to(sp);
}

void state_passing_ops(std::vector<Op>& ops, const Maker& make, const k::SsdInputs& in, const k::SsdParams& p,
                       const k::SsdStateGrads& grads, const std::string& shape) {
  const std::int64_t B = p.batch, L = p.seqlen, H = p.heads, P = p.head_dim, N = p.d_state;
  auto S0 = make({B, H, P, N}, 70, -1, 1), dS0 = make({B, H, P, N}, 0, 0, 0), decay = make({B, H}, 0, 0, 0),
       ddecay = make({B, H}, 71, -1, 1), dy = make({B, L, H, P}, 72, -1, 1), y = make({B, L, H, P}, 0, 0, 0);
  auto in0 = std::make_shared<k::SsdInputs>(in);
  in0->init_states = S0.get();
  auto pp = std::make_shared<k::SsdParams>(p);
  auto g = std::make_shared<k::SsdStateGrads>(grads);
  g->dinit_states = dS0.get();
  // Products: y_t += exp(cs_t) C_t . S0 (2 B L H P N); its backward forms dy_t^T S0 for dC and the
  // decays, and the sum of exp(cs_t) dy_t C_t^T for dS0 (2 B L H P N each).
  const double f = 2.0 * static_cast<double>(B * L * H) * static_cast<double>(P * N);
  ops.push_back({"ssd_run_decay", shape, 0, static_cast<double>(dtype_size(in.dt->dtype()) * B * L * H),
                 [=] { k::ssd_run_decay(*decay, *in0, *pp); }});
  ops.push_back({"ssd_init_state_fwd", shape, f, 0, [=] { k::ssd_init_state_fwd(*y, *in0, *pp); }});
  ops.push_back(
      {"ssd_init_state_bwd", shape, 2 * f, 0, [=] { k::ssd_init_state_bwd(*g, *in0, dy.get(), ddecay.get(), *pp); }});
}

void small_ops(std::vector<Op>& ops, const Maker& make, DType dt, std::int64_t sc) {
  const double es = static_cast<double>(dtype_size(dt));
  const auto T_ = [&](const Shape& s, std::uint64_t seed, double lo = -1, double hi = 1) {
    return make(s, seed, lo, hi);
  };
  {  // attention: one sequence, causal, GQA 8:2
    const std::int64_t L = 512 * sc, H = 8, Hkv = 2, D = 64;
    auto q = T_({L, H, D}, 1), kk = T_({L, Hkv, D}, 2), v = T_({L, Hkv, D}, 3), o = T_({L, H, D}, 4),
         lse = T_({L, H}, 5), dq = T_({L, H, D}, 6), dk = T_({L, Hkv, D}, 7), dv = T_({L, Hkv, D}, 8);
    auto p = std::make_shared<k::AttnParams>();
    p->heads = H;
    p->kv_heads = Hkv;
    p->head_dim = D;
    p->segments = k::segments_from_layout(SeqLayout::bshd(1, L), SeqLayout::bshd(1, L));
    const double f = 4.0 * H * L * L * D / 2;
    const std::string shp = "L=" + std::to_string(L) + " H=8 Hkv=2 D=64 causal";
    ops.push_back({"attention_fwd", shp, f, 0, [=] { k::attention_fwd(*o, *lse, *q, *kk, *v, *p); }});
    ops.push_back(
        {"attention_bwd", shp, 2.5 * f, 0, [=] { k::attention_bwd(*dq, *dk, *dv, *q, *kk, *v, *o, *lse, *o, *p); }});
  }
  {  // SSD
    auto p = std::make_shared<k::SsdParams>();
    p->batch = 1;
    p->seqlen = 512 * sc;
    p->heads = 8;
    p->head_dim = 32;
    p->groups = 1;
    p->d_state = 32;
    p->chunk = 64;
    const std::int64_t L = p->seqlen;
    auto x = T_({1, L, 8, 32}, 10), dt_ = T_({1, L, 8}, 11, -2, 0), A = T_({8}, 12), B = T_({1, L, 1, 32}, 13),
         C = T_({1, L, 1, 32}, 14), D = T_({8}, 15), db = T_({8}, 16), y = T_({1, L, 8, 32}, 17);
    auto dx = T_({1, L, 8, 32}, 0), ddt = T_({1, L, 8}, 0), dA = T_({8}, 0), dB = T_({1, L, 1, 32}, 0),
         dC = T_({1, L, 1, 32}, 0), dD = T_({8}, 0), ddb = T_({8}, 0);
    auto in = std::make_shared<k::SsdInputs>();
    in->x = x.get();
    in->dt = dt_.get();
    in->A_log = A.get();
    in->Bm = B.get();
    in->Cm = C.get();
    in->D = D.get();
    in->dt_bias = db.get();
    auto g = std::make_shared<k::SsdGrads>(
        k::SsdGrads{dx.get(), ddt.get(), dA.get(), dB.get(), dC.get(), dD.get(), ddb.get(), nullptr});
    const std::string shp = "b=1 L=" + std::to_string(L) + " H=8 P=32 G=1 N=32 chunk=64";
    const double bytes = es * (2.0 * L * 8 * 32 + 2.0 * L * 32 + L * 8);
    ops.push_back({"ssd_fwd", shp, 0, bytes, [=] { k::ssd_fwd(*y, nullptr, *in, *p); }});
    ops.push_back({"ssd_bwd", shp, 0, 2 * bytes, [=] { k::ssd_bwd(*g, *in, *y, nullptr, *p); }});
    state_passing_ops(ops, make, *in, *p, {dC.get(), ddt.get(), dA.get(), ddb.get(), nullptr}, shp);
  }
  {  // conv1d + SiLU
    const std::int64_t L = 2048 * sc, C = 256;
    auto x = T_({1, L, C}, 20), w = T_({C, 4}, 21), b = T_({C}, 22), y = T_({1, L, C}, 23), dx = T_({1, L, C}, 0),
         dw = T_({C, 4}, 0), db = T_({C}, 0);
    const std::string shp = "B=1 L=" + std::to_string(L) + " C=256 W=4";
    ops.push_back({"conv1d_fwd", shp, 0, es * 2 * L * C, [=] { k::conv1d_fwd(*y, *x, *w, b.get(), nullptr, true); }});
    ops.push_back({"conv1d_bwd", shp, 0, es * 3 * L * C,
                   [=] { k::conv1d_bwd(*dx, *dw, db.get(), *x, *w, b.get(), nullptr, true, *y); }});
  }
  {  // norms
    const std::int64_t M = 2048 * sc, C = 512;
    auto x = T_({M, C}, 30), z = T_({M, C}, 31), w = T_({C}, 32, 0.5, 1.5), y = T_({M, C}, 33), r = T_({M}, 0),
         r8 = T_({M, 8}, 0), dx = T_({M, C}, 0), dz = T_({M, C}, 0), dw = T_({C}, 0);
    const std::string shp = "M=" + std::to_string(M) + " C=512";
    ops.push_back({"rmsnorm_fwd", shp, 0, es * 2 * M * C, [=] { k::rmsnorm_fwd(*y, *r, *x, *w, 1e-5); }});
    ops.push_back({"rmsnorm_bwd", shp, 0, es * 3 * M * C, [=] { k::rmsnorm_bwd(*dx, *dw, *x, *w, *r, *y); }});
    ops.push_back({"gated_rmsnorm_fwd", shp + " G=8", 0, es * 3 * M * C,
                   [=] { k::gated_rmsnorm_fwd(*y, *r8, *x, *z, *w, 8, 1e-5); }});
    ops.push_back({"gated_rmsnorm_bwd", shp + " G=8", 0, es * 5 * M * C,
                   [=] { k::gated_rmsnorm_bwd(*dx, *dz, *dw, *x, *z, *w, *r8, 8, *y); }});
  }
  {  // dense
    const std::int64_t M = 256 * sc, K = 512, N = 512;
    auto x = T_({M, K}, 40), W = T_({N, K}, 41), b = T_({N}, 42), y = T_({M, N}, 43), dx = T_({M, K}, 0),
         dW = T_({N, K}, 0), db = T_({N}, 0);
    const std::string shp = "M=" + std::to_string(M) + " K=512 N=512";
    ops.push_back({"linear_fwd", shp, 2.0 * M * K * N, 0, [=] { k::linear_fwd(*y, *x, *W, b.get()); }});
    ops.push_back(
        {"linear_bwd", shp, 4.0 * M * K * N, 0, [=] { k::linear_bwd(dx.get(), dW.get(), db.get(), *x, *W, *y); }});
    if (x->space() == Space::Host) {  // the BLAS alone on linear_fwd's product, its anchor
      ops.push_back({"blas_gemm", shp + " (x W^T)", 2.0 * M * K * N, 0, [=] {
                       if (x->dtype() == DType::F64)
                         k::host::gemm(false, true, M, N, K, 1.0, x->data<double>(), K, W->data<double>(), K, 0.0,
                                       y->data<double>(), N);
                       else
                         k::host::gemm(false, true, M, N, K, 1.0f, x->data<float>(), K, W->data<float>(), K, 0.0f,
                                       y->data<float>(), N);
                     }});
    }
    const std::int64_t T = 1024 * sc;
    auto xr = T_({T, 8, 64}, 44), yr = T_({T, 8, 64}, 45);
    auto pos = std::make_shared<std::vector<std::int64_t>>();
    for (std::int64_t t = 0; t < T; ++t) pos->push_back(t);
    ops.push_back({"rope_fwd", "T=" + std::to_string(T) + " H=8 D=64", 0, es * 2 * T * 8 * 64,
                   [=] { k::rope_fwd(*yr, *xr, *pos, 10000.0, 64); }});
    const std::int64_t V = 8192;
    auto table = T_({V, 256}, 46), emb = T_({T, 256}, 47), dtab = T_({V, 256}, 0), logits = T_({T, V}, 48),
         dlog = T_({T, V}, 0);
    auto ids = std::make_shared<std::vector<std::int64_t>>();
    for (std::int64_t t = 0; t < T; ++t) ids->push_back((t * 7919) % V);
    ops.push_back({"embedding_fwd", "T=" + std::to_string(T) + " V=8192 C=256", 0, es * 2 * T * 256,
                   [=] { k::embedding_fwd(*emb, *table, *ids); }});
    ops.push_back({"embedding_bwd", "T=" + std::to_string(T) + " V=8192 C=256", 0, es * (V + T) * 256,
                   [=] { k::embedding_bwd(*dtab, *ids, *emb); }});
    ops.push_back({"cross_entropy_fwd", "T=" + std::to_string(T) + " V=8192", 0, es * T * V,
                   [=] { (void)k::cross_entropy_fwd(*logits, *ids, -100, nullptr); }});
    ops.push_back({"cross_entropy_bwd", "T=" + std::to_string(T) + " V=8192", 0, es * 2 * T * V,
                   [=] { k::cross_entropy_bwd(*dlog, *logits, *ids, -100, 1.0); }});
  }
  {  // MoE: router + permute + grouped experts + combine
    const std::int64_t T = 512 * sc, C = 256, F = 512, E = 16, K = 2;
    auto rp = std::make_shared<k::RouterParams>();
    rp->experts = E;
    rp->topk = K;
    rp->scaling = 2.5;
    auto logits = T_({T, E}, 50), scores = T_({T, E}, 0), tw = T_({T, K}, 0), x = T_({T, C}, 51),
         xp = T_({T * K, C}, 0), W1 = T_({E, F, C}, 52, -0.1, 0.1), W2 = T_({E, C, F}, 53, -0.1, 0.1),
         h = T_({T * K, F}, 0), yp = T_({T * K, C}, 0), y = T_({T, C}, 0), dxp = T_({T * K, C}, 0),
         dW1 = T_({E, F, C}, 0), dW2 = T_({E, C, F}, 0);
    // One routing shared by the ops, which run in this order (the router remakes it; the permute
    // adds the permutation the combine uses).
    auto route = std::make_shared<k::MoeRouting>();
    k::router_fwd(*scores, *route, *tw, *logits, nullptr, *rp);
    k::moe_permute(*xp, *route, *x);
    const std::string shp = "T=" + std::to_string(T) + " E=16 k=2 C=256 F=512 sqrelu";
    ops.push_back({"moe_router_fwd", "T=" + std::to_string(T) + " E=16 k=2", 0, es * 2 * T * E,
                   [=] { k::router_fwd(*scores, *route, *tw, *logits, nullptr, *rp); }});
    ops.push_back({"moe_permute", shp, 0, es * 2 * T * K * C, [=] { k::moe_permute(*xp, *route, *x); }});
    ops.push_back({"expert_mlp_fwd", shp, 4.0 * T * K * C * F, 0,
                   [=] { k::expert_mlp_fwd(*yp, *h, *xp, *W1, *W2, route->counts, k::Activation::SquaredReLU); }});
    ops.push_back({"expert_mlp_bwd", shp, 8.0 * T * K * C * F, 0, [=] {
                     k::expert_mlp_bwd(*dxp, *dW1, *dW2, *xp, *W1, *W2, *h, route->counts, k::Activation::SquaredReLU,
                                       *yp);
                   }});
    ops.push_back({"moe_combine_fwd", shp, 0, es * 2 * T * K * C, [=] { k::moe_combine_fwd(*y, *yp, *route, *tw); }});
  }
}

}  // namespace hcp::drivers
