// bench_kernels (host mode): the time of every host kernel on a documented shape, so regressions
// show. Each op: warm-up, then `repeats` timed runs (Kokkos::fence before each timer); median,
// min and max, with an effective GFLOP/s or GB/s. Printed as a table and written to HDF5
// (/timings/<op> [ranks, repeats] in ms). Every rank runs the same ops (no communication).
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <functional>
#include <memory>

#include "common.hpp"
#include "harness.hpp"
#include "io/results.hpp"
#include "kernels/kernels.hpp"

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

Tensor rnd(const Shape& s, DType dt, std::uint64_t seed, double lo = -1, double hi = 1) {
  Tensor t = Tensor::empty(s, dt);
  fill_uniform(t, seed, lo, hi);
  return t;
}

void run(DriverContext& ctx) {
  const DType dt = dtype_from_string(ctx.deck.get_string("bench.dtype"));
  const std::int64_t sc = ctx.deck.get_int("bench.scale");
  const int warm = static_cast<int>(ctx.deck.get_int("bench.warmup")), reps = static_cast<int>(ctx.deck.get_int("bench.repeats"));
  const double es = static_cast<double>(dtype_size(dt));
  std::vector<Op> ops;
  // Keep tensors alive for the closures.
  std::vector<std::shared_ptr<Tensor>> keep;
  auto T_ = [&](const Shape& s, std::uint64_t seed, double lo = -1, double hi = 1) {
    keep.push_back(std::make_shared<Tensor>(rnd(s, dt, seed, lo, hi)));
    return keep.back();
  };

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

  std::unique_ptr<ResultsWriter> w;
  if (!ctx.out.empty()) w = std::make_unique<ResultsWriter>(ctx.out, *ctx.world);
  if (w) {
    w->config({{"driver", "bench_kernels"}, {"mode", "host"}, {"deck", ctx.deck.text()}, {"command_line", ctx.cmdline},
               {"git_revision", ctx.git_rev}, {"dtype", to_string(dt)}, {"backend", "host (Kokkos Serial)"}});
    w->config_int("world_size", ctx.world->size());
  }
  if (ctx.root()) {
    std::printf("# bench_kernels (host, Kokkos %s, one rank's figures; %d ranks ran) dtype=%s repeats=%d\n",
                Kokkos::DefaultHostExecutionSpace::name(), ctx.world->size(), to_string(dt).c_str(), reps);
    std::printf("# %-18s %-42s %10s %10s %10s %10s\n", "op", "shape", "median_ms", "min_ms", "max_ms", "GFLOP/s|GB/s");
  }
  for (auto& op : ops) {
    for (int i = 0; i < warm; ++i) op.fn();
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
      Kokkos::fence();
      const double t0 = MPI_Wtime();
      op.fn();
      Kokkos::fence();
      ms.push_back((MPI_Wtime() - t0) * 1e3);
    }
    if (w) w->timings(op.name, ms);
    if (ctx.root()) {
      const double med = drivers::median(ms);
      const double thr = op.flops > 0 ? op.flops / (med * 1e6) : op.bytes / (med * 1e6);
      std::printf("  %-18s %-42s %10.3f %10.3f %10.3f %8.2f %s\n", op.name.c_str(), op.shape.c_str(), med,
                  *std::min_element(ms.begin(), ms.end()), *std::max_element(ms.begin(), ms.end()), thr,
                  op.flops > 0 ? "GF" : "GB");
    }
  }
  if (w) w->finish();
  if (ctx.root()) std::printf("RESULT bench_kernels DONE ops=%zu%s%s\n", ops.size(), ctx.out.empty() ? "" : " file=", ctx.out.c_str());
}
}  // namespace

int main(int argc, char** argv) {
  DriverSpec spec;
  spec.name = "bench_kernels";
  spec.description = "Time every host kernel on documented shapes (host mode)";
  spec.schema.add_string("bench.dtype", "fp32", "precision", {"fp32", "fp64"})
      .add_int("bench.warmup", 1, "untimed calls per op", 0)
      .add_int("bench.repeats", 5, "timed calls per op", 1)
      .add_int("bench.scale", 1, "multiplies the token count of every shape", 1, 64);
  spec.builtin_deck = kDeck;
  spec.default_out = "bench_kernels.h5";
  spec.run = run;
  return run_driver(argc, argv, spec);
}
