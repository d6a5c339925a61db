// bench_kernels: the time of every kernel on documented shapes, so regressions show.
//   bench.device = host: the host kernels on small shapes (suite "small").
//   bench.device = cuda: the CUDA kernels, suite "small" or "anchors" (the anchor
//     shapes of benchmarks/PERFORMANCE.md: attention, Mamba2 SSD, the grouped expert GEMM beside one dense
//     cuBLAS GEMM of the same FLOPs, memory-bound kernels beside a device-to-device copy);
//     jobs/bench/anchors.py times PyTorch / mamba_ssm on the same shapes and `hcp_post.py anchors`
//     puts both into one ratio table.
// Each op: warm-up, then `repeats` timed runs (device synchronised before and after each timer);
// median, min and max, with an effective TFLOP/s or GB/s. Printed as a table and written to HDF5
// (/timings/<op> [ranks, repeats] in ms, /bench/<op> = [flops, bytes, scratch high-water bytes]).
// Every rank runs the same ops (no communication).
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <memory>

#include "common.hpp"
#include "harness.hpp"
#include "io/results.hpp"
#include "kernels/kernels.hpp"
#include "device.hpp"
#ifdef HCP_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/runtime.hpp"
#endif

using namespace hcp;
namespace k = hcp::kernels;

namespace {
const char* kDeck = R"(# bench_kernels built-in deck: host kernels on small, documented shapes.
[bench]
dtype = "fp32"
warmup = 1
repeats = 5
scale = 1       # multiplies the token counts of every shape
)";

struct Op {
  std::string name, shape;
  double flops = 0, bytes = 0;  // per call, for the throughput column
  std::function<void()> fn;
};

// Seed 0 with lo == hi == 0 asks for zeros, made where they live (no host fill and copy: the anchor
// suite's tensors hold billions of elements).
Tensor rnd(const Shape& s, DType dt, std::uint64_t seed, double lo = -1, double hi = 1, Space sp = Space::Host) {
  if (seed == 0 && lo == 0 && hi == 0) return Tensor::zeros(s, dt, sp);
  Tensor t = Tensor::empty(s, dt, Space::Host);
  fill_uniform(t, seed, lo, hi);
  return sp == Space::Host ? t : t.to(sp);
}

using Maker = std::function<std::shared_ptr<Tensor>(const Shape&, std::uint64_t, double, double)>;

// The anchor shapes (GPU only). Inputs are made only for the groups whose op names `only`
// matches (filling them all on the host takes minutes).
void anchor_ops(std::vector<Op>& ops, const Maker& T_, DType dt, const std::string& only) {
  const double es = static_cast<double>(dtype_size(dt));
  const auto want = [&only](std::initializer_list<std::string> names) {
    return only.empty() || std::any_of(names.begin(), names.end(), [&](const std::string& n) { return n.find(only) != std::string::npos; });
  };
  auto attention = [&](std::int64_t B, std::int64_t H, std::int64_t L, std::int64_t D, bool bwd) {
    const std::string tag = "_b" + std::to_string(B) + "h" + std::to_string(H) + "l" + std::to_string(L) + "d" + std::to_string(D);
    if (!want({"attention_fwd" + tag, bwd ? "attention_bwd" + tag : "attention_fwd" + tag})) return;
    auto q = T_({B, L, H, D}, 1, -1, 1), kk = T_({B, L, H, D}, 2, -1, 1), v = T_({B, L, H, D}, 3, -1, 1),
         o = T_({B, L, H, D}, 0, 0, 0);
    // The log-sum-exp is fp32 for bf16 inputs (fp64 for fp64).
    auto lse = std::make_shared<Tensor>(Tensor::zeros({B * L, H}, dt == DType::F64 ? DType::F64 : DType::F32, q->space()));
    auto p = std::make_shared<k::AttnParams>();
    p->heads = H;
    p->kv_heads = H;
    p->head_dim = D;
    p->segments = k::segments_from_layout(SeqLayout::bshd(B, L), SeqLayout::bshd(B, L));
    const double f = 4.0 * B * H * L * L * D / 2;  // causal
    const std::string shp = "B=" + std::to_string(B) + " H=" + std::to_string(H) + " L=" + std::to_string(L) +
                            " D=" + std::to_string(D) + " causal";
    ops.push_back({"attention_fwd" + tag, shp, f, 0, [=] { k::attention_fwd(*o, *lse, *q, *kk, *v, *p); }});
    if (bwd) {
      auto dq = T_({B, L, H, D}, 0, 0, 0), dk = T_({B, L, H, D}, 0, 0, 0), dv = T_({B, L, H, D}, 0, 0, 0);
      ops.push_back({"attention_bwd" + tag, shp, 2.5 * f, 0, [=] { k::attention_bwd(*dq, *dk, *dv, *q, *kk, *v, *o, *lse, *o, *p); }});
    }
  };
  attention(2, 16, 8192, 128, true);
  attention(4, 32, 4096, 64, true);
  attention(1, 16, 32768, 128, false);
  if (want({"ssd_fwd", "ssd_bwd"})) {  // Mamba2 SSD, the anchor shape
    auto p = std::make_shared<k::SsdParams>();
    p->batch = 2;
    p->seqlen = 8192;
    p->heads = 128;
    p->head_dim = 64;
    p->groups = 8;
    p->d_state = 128;
    p->chunk = 128;
    const std::int64_t B = 2, L = 8192, H = 128, P = 64, G = 8, N = 128;
    auto x = T_({B, L, H, P}, 10, -1, 1), dt_ = T_({B, L, H}, 11, -4, -1), A = T_({H}, 12, 0, 1), Bm = T_({B, L, G, N}, 13, -1, 1),
         C = T_({B, L, G, N}, 14, -1, 1), D = T_({H}, 15, -1, 1), db = T_({H}, 16, -0.5, 0.5), y = T_({B, L, H, P}, 0, 0, 0);
    auto dx = T_({B, L, H, P}, 0, 0, 0), ddt = T_({B, L, H}, 0, 0, 0), dA = T_({H}, 0, 0, 0), dB = T_({B, L, G, N}, 0, 0, 0),
         dC = T_({B, L, G, N}, 0, 0, 0), dD = T_({H}, 0, 0, 0), ddb = T_({H}, 0, 0, 0);
    auto in = std::make_shared<k::SsdInputs>(k::SsdInputs{x.get(), dt_.get(), A.get(), Bm.get(), C.get(), D.get(), db.get(), nullptr, nullptr});
    auto g = std::make_shared<k::SsdGrads>(k::SsdGrads{dx.get(), ddt.get(), dA.get(), dB.get(), dC.get(), dD.get(), ddb.get(), nullptr});
    const std::string shp = "b=2 L=8192 H=128 P=64 G=8 N=128 chunk=128";
    const double bytes = es * (2.0 * B * L * H * P + 2.0 * B * L * G * N + B * L * H);
    ops.push_back({"ssd_fwd", shp, 0, bytes, [=] { k::ssd_fwd(*y, nullptr, *in, *p); }});
    ops.push_back({"ssd_bwd", shp, 0, 2 * bytes, [=] { k::ssd_bwd(*g, *in, *y, nullptr, *p); }});
  }
#ifdef HCP_HAVE_CUDA
  if (want({"grouped_gemm", "dense_gemm_same_flops", "expert_mlp_fwd"})) {  // MoE expert GEMM: 128 experts, top-6, hidden 2688, FFN 1856, 16k tokens, uneven counts
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
                       static_cast<char*>(h->raw()) + static_cast<std::size_t>(r0 * F) * esz, (*counts)[static_cast<std::size_t>(e)],
                       F, C, C, C, F});
      r0 += (*counts)[static_cast<std::size_t>(e)];
    }
    const double f = 2.0 * rows * C * F;
    ops.push_back({"grouped_gemm", "E=128 rows=98304 (uneven) K=2688 N=1856", f, 0,
                   [=] { kernels::cuda_impl::grouped_gemm(false, true, *desc, dt); }});
    auto Wd = T_({F, C}, 52, -0.05, 0.05);
    ops.push_back({"dense_gemm_same_flops", "M=98304 K=2688 N=1856 (cuBLAS)", f, 0, [=] { k::linear_fwd(*h, *x, *Wd, nullptr); }});
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
    auto xc = T_({2, L, Cc}, 20, -1, 1), wc = T_({Cc, 4}, 21, -1, 1), bc = T_({Cc}, 22, -1, 1), yc = T_({2, L, Cc}, 0, 0, 0);
    ops.push_back({"conv1d_fwd", "B=2 L=8192 C=10240 W=4 silu", 0, es * 2 * 2 * L * Cc,
                   [=] { k::conv1d_fwd(*yc, *xc, *wc, bc.get(), nullptr, true); }});
    const std::int64_t Tn = 16384;
    auto xr = T_({Tn, 32, 128}, 40, -1, 1), yr = T_({Tn, 32, 128}, 0, 0, 0);
    auto pos = std::make_shared<std::vector<std::int64_t>>();
    for (std::int64_t t = 0; t < Tn; ++t) pos->push_back(t);
    ops.push_back({"rope_fwd", "T=16384 H=32 D=128", 0, es * 2 * Tn * 32 * 128, [=] { k::rope_fwd(*yr, *xr, *pos, 10000.0, 128); }});
    auto big = T_({M, Cn * 4}, 60, -1, 1), dst = T_({M, Cn * 4}, 0, 0, 0);
    ops.push_back({"device_copy", "256 Mi elements", 0, es * 2 * M * Cn * 4, [=] { dst->copy_from(*big); }});
  }
}

void run(DriverContext& ctx) {
  const DType dt = dtype_from_string(ctx.deck.get_string("bench.dtype"));
  const Space sp = ctx.deck.get_string("bench.device") == "cuda" ? Space::Cuda : Space::Host;
  const bool anchors = ctx.deck.get_string("bench.suite") == "anchors";
  HCP_CHECK(!anchors || sp == Space::Cuda, "bench.suite = \"anchors\" needs bench.device = \"cuda\" (the shapes are GPU-sized)");
  HCP_CHECK(sp == Space::Cuda || dt != DType::BF16, "bench.dtype = \"bf16\" needs bench.device = \"cuda\" (the host kernels have no bf16)");
  const auto sync = [sp] {
#ifdef HCP_HAVE_CUDA
    if (sp == Space::Cuda) return cuda::synchronize();
#endif
    Kokkos::fence();
  };
  const std::int64_t sc = ctx.deck.get_int("bench.scale");
  const int warm = static_cast<int>(ctx.deck.get_int("bench.warmup")), reps = static_cast<int>(ctx.deck.get_int("bench.repeats"));
  const double es = static_cast<double>(dtype_size(dt));
  std::vector<Op> ops;
  // Keep tensors alive for the closures.
  std::vector<std::shared_ptr<Tensor>> keep;
  auto T_ = [&](const Shape& s, std::uint64_t seed, double lo = -1, double hi = 1) {
    keep.push_back(std::make_shared<Tensor>(rnd(s, dt, seed, lo, hi, sp)));
    return keep.back();
  };
  if (anchors) {
    anchor_ops(ops, [&](const Shape& s, std::uint64_t seed, double lo, double hi) { return T_(s, seed, lo, hi); }, dt,
               ctx.deck.get_string("bench.only"));
  } else {

  {  // attention: one sequence, causal, GQA 8:2
    const std::int64_t L = 512 * sc, H = 8, Hkv = 2, D = 64;
    auto q = T_({L, H, D}, 1), kk = T_({L, Hkv, D}, 2), v = T_({L, Hkv, D}, 3), o = T_({L, H, D}, 4), lse = T_({L, H}, 5),
         dq = T_({L, H, D}, 6), dk = T_({L, Hkv, D}, 7), dv = T_({L, Hkv, D}, 8);
    auto p = std::make_shared<k::AttnParams>();
    p->heads = H;
    p->kv_heads = Hkv;
    p->head_dim = D;
    p->segments = k::segments_from_layout(SeqLayout::bshd(1, L), SeqLayout::bshd(1, L));
    const double f = 4.0 * H * L * L * D / 2;
    const std::string shp = "L=" + std::to_string(L) + " H=8 Hkv=2 D=64 causal";
    ops.push_back({"attention_fwd", shp, f, 0, [=] { k::attention_fwd(*o, *lse, *q, *kk, *v, *p); }});
    ops.push_back({"attention_bwd", shp, 2.5 * f, 0, [=] { k::attention_bwd(*dq, *dk, *dv, *q, *kk, *v, *o, *lse, *o, *p); }});
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
    auto g = std::make_shared<k::SsdGrads>(k::SsdGrads{dx.get(), ddt.get(), dA.get(), dB.get(), dC.get(), dD.get(), ddb.get(), nullptr});
    const std::string shp = "b=1 L=" + std::to_string(L) + " H=8 P=32 G=1 N=32 chunk=64";
    const double bytes = es * (2.0 * L * 8 * 32 + 2.0 * L * 32 + L * 8);
    ops.push_back({"ssd_fwd", shp, 0, bytes, [=] { k::ssd_fwd(*y, nullptr, *in, *p); }});
    ops.push_back({"ssd_bwd", shp, 0, 2 * bytes, [=] { k::ssd_bwd(*g, *in, *y, nullptr, *p); }});
  }
  {  // conv1d + SiLU
    const std::int64_t L = 2048 * sc, C = 256;
    auto x = T_({1, L, C}, 20), w = T_({C, 4}, 21), b = T_({C}, 22), y = T_({1, L, C}, 23), dx = T_({1, L, C}, 0),
         dw = T_({C, 4}, 0), db = T_({C}, 0);
    const std::string shp = "B=1 L=" + std::to_string(L) + " C=256 W=4";
    ops.push_back({"conv1d_fwd", shp, 0, es * 2 * L * C, [=] { k::conv1d_fwd(*y, *x, *w, b.get(), nullptr, true); }});
    ops.push_back({"conv1d_bwd", shp, 0, es * 3 * L * C, [=] { k::conv1d_bwd(*dx, *dw, db.get(), *x, *w, b.get(), nullptr, true, *y); }});
  }
  {  // norms
    const std::int64_t M = 2048 * sc, C = 512;
    auto x = T_({M, C}, 30), z = T_({M, C}, 31), w = T_({C}, 32, 0.5, 1.5), y = T_({M, C}, 33), r = T_({M}, 0),
         r8 = T_({M, 8}, 0), dx = T_({M, C}, 0), dz = T_({M, C}, 0), dw = T_({C}, 0);
    const std::string shp = "M=" + std::to_string(M) + " C=512";
    ops.push_back({"rmsnorm_fwd", shp, 0, es * 2 * M * C, [=] { k::rmsnorm_fwd(*y, *r, *x, *w, 1e-5); }});
    ops.push_back({"rmsnorm_bwd", shp, 0, es * 3 * M * C, [=] { k::rmsnorm_bwd(*dx, *dw, *x, *w, *r, *y); }});
    ops.push_back({"gated_rmsnorm_fwd", shp + " G=8", 0, es * 3 * M * C, [=] { k::gated_rmsnorm_fwd(*y, *r8, *x, *z, *w, 8, 1e-5); }});
    ops.push_back({"gated_rmsnorm_bwd", shp + " G=8", 0, es * 5 * M * C,
                   [=] { k::gated_rmsnorm_bwd(*dx, *dz, *dw, *x, *z, *w, *r8, 8, *y); }});
  }
  {  // dense
    const std::int64_t M = 256 * sc, K = 512, N = 512;
    auto x = T_({M, K}, 40), W = T_({N, K}, 41), b = T_({N}, 42), y = T_({M, N}, 43), dx = T_({M, K}, 0), dW = T_({N, K}, 0),
         db = T_({N}, 0);
    const std::string shp = "M=" + std::to_string(M) + " K=512 N=512";
    ops.push_back({"linear_fwd", shp, 2.0 * M * K * N, 0, [=] { k::linear_fwd(*y, *x, *W, b.get()); }});
    ops.push_back({"linear_bwd", shp, 4.0 * M * K * N, 0, [=] { k::linear_bwd(dx.get(), dW.get(), db.get(), *x, *W, *y); }});
    const std::int64_t T = 1024 * sc;
    auto xr = T_({T, 8, 64}, 44), yr = T_({T, 8, 64}, 45);
    auto pos = std::make_shared<std::vector<std::int64_t>>();
    for (std::int64_t t = 0; t < T; ++t) pos->push_back(t);
    ops.push_back({"rope_fwd", "T=" + std::to_string(T) + " H=8 D=64", 0, es * 2 * T * 8 * 64,
                   [=] { k::rope_fwd(*yr, *xr, *pos, 10000.0, 64); }});
    const std::int64_t V = 8192;
    auto table = T_({V, 256}, 46), emb = T_({T, 256}, 47), dtab = T_({V, 256}, 0), logits = T_({T, V}, 48), dlog = T_({T, V}, 0);
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
    auto logits = T_({T, E}, 50), scores = T_({T, E}, 0), tw = T_({T, K}, 0), x = T_({T, C}, 51), xp = T_({T * K, C}, 0),
         W1 = T_({E, F, C}, 52, -0.1, 0.1), W2 = T_({E, C, F}, 53, -0.1, 0.1), h = T_({T * K, F}, 0), yp = T_({T * K, C}, 0),
         y = T_({T, C}, 0), dxp = T_({T * K, C}, 0), dW1 = T_({E, F, C}, 0), dW2 = T_({E, C, F}, 0);
    auto idx = std::make_shared<std::vector<std::int64_t>>(), counts = std::make_shared<std::vector<std::int64_t>>(),
         src = std::make_shared<std::vector<std::int64_t>>();
    k::router_fwd(*scores, *idx, *tw, *logits, nullptr, *rp);
    k::moe_permute(*xp, *counts, *src, *x, *idx, E);
    const std::string shp = "T=" + std::to_string(T) + " E=16 k=2 C=256 F=512 sqrelu";
    ops.push_back({"moe_router_fwd", "T=" + std::to_string(T) + " E=16 k=2", 0, es * 2 * T * E,
                   [=] { k::router_fwd(*scores, *idx, *tw, *logits, nullptr, *rp); }});
    ops.push_back({"moe_permute", shp, 0, es * 2 * T * K * C, [=] { k::moe_permute(*xp, *counts, *src, *x, *idx, E); }});
    ops.push_back({"expert_mlp_fwd", shp, 4.0 * T * K * C * F, 0,
                   [=] { k::expert_mlp_fwd(*yp, *h, *xp, *W1, *W2, *counts, k::Activation::SquaredReLU); }});
    ops.push_back({"expert_mlp_bwd", shp, 8.0 * T * K * C * F, 0,
                   [=] { k::expert_mlp_bwd(*dxp, *dW1, *dW2, *xp, *W1, *W2, *h, *counts, k::Activation::SquaredReLU, *yp); }});
    ops.push_back({"moe_combine_fwd", shp, 0, es * 2 * T * K * C, [=] { k::moe_combine_fwd(*y, *yp, *src, *tw); }});
  }
  }  // suite "small"

  const std::string only = ctx.deck.get_string("bench.only");
  HCP_CHECK(only.empty() || std::any_of(ops.begin(), ops.end(), [&](const Op& o) { return o.name.find(only) != std::string::npos; }),
            "bench.only = \"", only, "\" matches no op of suite \"", ctx.deck.get_string("bench.suite"), "\"");
  std::unique_ptr<ResultsWriter> w;
  if (!ctx.out.empty()) w = std::make_unique<ResultsWriter>(ctx.out, *ctx.world);
  if (w) {
    std::string backend = "host (Kokkos Serial)";
#ifdef HCP_HAVE_CUDA
    if (sp == Space::Cuda) backend = cuda::device_name();
#endif
    w->config({{"driver", "bench_kernels"}, {"mode", sp == Space::Cuda ? "cuda" : "host"}, {"suite", ctx.deck.get_string("bench.suite")},
               {"deck", ctx.deck.text()}, {"command_line", ctx.cmdline}, {"git_revision", ctx.git_rev}, {"dtype", to_string(dt)},
               {"backend", backend}});
    w->config_int("world_size", ctx.world->size());
  }
  if (ctx.root()) {
    std::printf("# bench_kernels (%s, suite %s, one rank's figures; %d ranks ran) dtype=%s repeats=%d\n",
                sp == Space::Cuda ? "cuda" : Kokkos::DefaultHostExecutionSpace::name(), ctx.deck.get_string("bench.suite").c_str(),
                ctx.world->size(), to_string(dt).c_str(), reps);
    std::printf("# %-28s %-42s %10s %10s %10s %10s %10s\n", "op", "shape", "median_ms", "min_ms", "max_ms", "GFLOP/s|GB/s",
                "scratch_MB");
  }
  std::size_t ran = 0;
  for (auto& op : ops) {
    if (!only.empty() && op.name.find(only) == std::string::npos) continue;
    ++ran;
#ifdef HCP_HAVE_CUDA
    if (sp == Space::Cuda) (void)cuda::scratch_high_water(true);
#endif
    for (int i = 0; i < warm; ++i) op.fn();
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      sync();
#ifdef HCP_HAVE_CUDA
      if (sp == Space::Cuda) {  // CUDA events on the stream, as the anchors are timed
        ms.push_back(cuda::time_ms(op.fn));
        continue;
      }
#endif
      const double t0 = MPI_Wtime();
      op.fn();
      sync();
      ms.push_back((MPI_Wtime() - t0) * 1e3);
    }
    double scratch = 0;
#ifdef HCP_HAVE_CUDA
    if (sp == Space::Cuda) scratch = static_cast<double>(cuda::scratch_high_water(true));
#endif
    if (w) {
      w->timings(op.name, ms);
      w->tensor("/bench/" + op.name, Tensor::from({op.flops, op.bytes, scratch}, {3}, DType::F64),
                "[flops per call, bytes per call, kernel scratch high-water bytes]; " + op.shape, "1");
    }
    if (ctx.root()) {
      const double med = drivers::median(ms);
      const double thr = op.flops > 0 ? op.flops / (med * 1e6) : op.bytes / (med * 1e6);
      std::printf("  %-28s %-42s %10.3f %10.3f %10.3f %8.2f %s %10.1f\n", op.name.c_str(), op.shape.c_str(), med,
                  *std::min_element(ms.begin(), ms.end()), *std::max_element(ms.begin(), ms.end()), thr,
                  op.flops > 0 ? "GF" : "GB", scratch / 1048576.0);
      std::fflush(stdout);
    }
  }
  if (w) w->finish();
  if (ctx.root()) std::printf("RESULT bench_kernels DONE ops=%zu%s%s\n", ran, ctx.out.empty() ? "" : " file=", ctx.out.c_str());
}
}  // namespace

int main(int argc, char** argv) {
  DriverSpec spec;
  spec.name = "bench_kernels";
  spec.description = "Time every kernel on documented shapes (host kernels, or CUDA kernels incl. the anchor shapes)";
  spec.schema.add_string("bench.dtype", "fp32", "precision (bf16: cuda only)", {"fp32", "fp64", "bf16"})
      .add_string("bench.device", "host", "host (Kokkos kernels) or cuda", {"host", "cuda"})
      .add_string("bench.suite", "small", "small (every kernel, small shapes) or anchors (the anchor shapes, cuda)",
                  {"small", "anchors"})
      .add_string("bench.only", "", "run only the ops whose name contains this text (empty: all)")
      .add_int("bench.warmup", 1, "untimed calls per op", 0)
      .add_int("bench.repeats", 5, "timed calls per op", 1)
      .add_int("bench.scale", 1, "multiplies the token count of every shape", 1, 64);
  spec.builtin_deck = kDeck;
  spec.default_out = "bench_kernels.h5";
  spec.validate = [](DriverContext& ctx) {
    if (ctx.deck.get_string("bench.device") == "cuda") {
#ifdef HCP_HAVE_CUDA
      HCP_CHECK(cuda::device_count() > 0, "bench.device = \"cuda\": no usable GPU on this node (", cuda::unavailable_reason(), ")");
      cuda::init(drivers::local_rank_and_size(nullptr));
#else
      HCP_FAIL("bench.device = \"cuda\" needs a build with CUDA (this build has none)");
#endif
    }
  };
  spec.run = run;
  return run_driver(argc, argv, spec);
}
