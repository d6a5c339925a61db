// cp_attention: one attention layer under context parallelism. For each strategy (p2p ring,
// all-gather, Ulysses a2a) it runs forward+backward on the CP group, compares outputs and input
// gradients (gathered to global order) with a cp=1 run, times compute and communication per rank,
// and writes everything to HDF5.
#include <mpi.h>

#include <cstdio>
#include <memory>

#include "common.hpp"
#include "comm/process_grid.hpp"
#include "cp/attention_cp.hpp"
#include "cp/layout.hpp"
#include "device.hpp"
#include "harness.hpp"
#include "overlap.hpp"
#include "io/results.hpp"

using namespace hcp;
namespace k = hcp::kernels;

namespace {

const char* kBuiltinDeck = R"(# Built-in deck of cp_attention: a small packed (THD) batch, every strategy.
[attention]
heads = 8          # query heads
kv_heads = 2       # GQA: 4 query heads per K/V head
head_dim = 32
causal = true

[data]
format = "thd"              # "bshd" (batch x seqlen) or "thd" (packed sequences)
seq_lens = "200, 56, 500"   # THD: lengths before padding to a multiple of 2*cp
batch = 2                   # BSHD only
seqlen = 512                # BSHD only (multiple of 2*cp)
dtype = "fp64"
seed = 1

[parallel]
cp_size = 0                 # 0: all ranks form one CP group
strategy = "all"            # p2p | allgather | a2a | all

[run]
warmup = 1
repeats = 3
check = true                # compare with cp=1
)";

DeckSchema schema() {
  DeckSchema s;
  s.add_int("attention.heads", 8, "query heads", 1)
      .add_int("attention.kv_heads", 2, "key/value heads (divides heads)", 1)
      .add_int("attention.head_dim", 32, "head dimension", 1, 1024)
      .add_bool("attention.causal", true, "causal mask (false: full attention)")
      .add_string("parallel.strategy", "all", "attention CP strategy", {"p2p", "allgather", "a2a", "all"});
  drivers::add_cp_driver_keys(s, "200, 56, 500", 512, /*with_bf16=*/true);
  drivers::add_device_key(s);
  return s;
}

struct Setup {
  int cp = 1;
  SeqLayout global;
  cp::CpAttnConfig base;
  std::vector<cp::AttnStrategy> strategies;
  DType dt = DType::F64;
};

Setup make_setup(const DriverContext& ctx) {
  const Deck& d = ctx.deck;
  Setup s;
  s.cp = drivers::cp_size_of(d, ctx.world->size());
  s.dt = dtype_from_string(d.get_string("data.dtype"));
  s.global = drivers::global_layout(d, s.cp);

  s.base.heads = d.get_int("attention.heads");
  s.base.kv_heads = d.get_int("attention.kv_heads");
  s.base.head_dim = d.get_int("attention.head_dim");
  s.base.causal = d.get_bool("attention.causal");
  s.base.global = s.global;
  HCP_CHECK(s.base.heads % s.base.kv_heads == 0, "attention.kv_heads = ", s.base.kv_heads,
            " must divide attention.heads = ", s.base.heads);
  const std::string st = d.get_string("parallel.strategy");
  if (st == "all")
    s.strategies = {cp::AttnStrategy::P2P, cp::AttnStrategy::AllGather, cp::AttnStrategy::A2A};
  else
    s.strategies = {cp::attn_strategy_from_string(st)};
  return s;
}

void validate(DriverContext& ctx) {
  drivers::init_device(ctx.deck);
  Setup s = make_setup(ctx);
  // Constructing each strategy checks its own divisibility rules (e.g. a2a: heads % cp).
  ProcessGrid grid = ProcessGrid::make(*ctx.world, s.cp);
  for (auto st : s.strategies) {
    auto c = s.base;
    c.strategy = st;
    cp::CpAttention a(*grid.cp, c);
  }
}

void run(DriverContext& ctx) {
  Setup s = make_setup(ctx);
  ProcessGrid grid = ProcessGrid::make(*ctx.world, s.cp);
  std::unique_ptr<Communicator> nccl;
  Communicator& cpc = drivers::device_comm(ctx.deck, *grid.cp, nccl);
  const Space space = drivers::space_of(ctx.deck);  // the CP runs; the cp=1 reference is the host oracle
  auto host = [](const Tensor& t) { return t.space() == Space::Host ? t : t.to(Space::Host); };
  const int r = grid.cp_rank;
  const std::int64_t T = s.global.total(), H = s.base.heads, Hkv = s.base.kv_heads, D = s.base.head_dim;
  const auto seed = static_cast<std::uint64_t>(ctx.deck.get_int("data.seed"));
  Tensor q = Tensor::empty({T, H, D}, s.dt), kk = Tensor::empty({T, Hkv, D}, s.dt), v = Tensor::empty({T, Hkv, D}, s.dt),
         dout = Tensor::empty({T, H, D}, s.dt);
  fill_uniform(q, seed * 4 + 0);
  fill_uniform(kk, seed * 4 + 1);
  fill_uniform(v, seed * 4 + 2);
  fill_uniform(dout, seed * 4 + 3);
  const bool check = ctx.deck.get_bool("run.check");
  const int warmup = static_cast<int>(ctx.deck.get_int("run.warmup")), reps = static_cast<int>(ctx.deck.get_int("run.repeats"));

  // cp = 1 reference (rank 0 of the world computes it).
  Tensor ro, rdq, rdk, rdv;
  double ref_ms = 0;
  if (check && ctx.root()) {
    k::AttnParams p;
    p.heads = H;
    p.kv_heads = Hkv;
    p.head_dim = D;
    p.mask = s.base.causal ? k::Mask::Causal : k::Mask::None;
    p.segments = k::segments_from_layout(s.global, s.global);
    ro = Tensor::zeros(q.shape(), s.dt);
    rdq = Tensor::zeros(q.shape(), s.dt);
    rdk = Tensor::zeros(kk.shape(), s.dt);
    rdv = Tensor::zeros(v.shape(), s.dt);
    Tensor lse = Tensor::zeros({T, H}, s.dt);
    const double t0 = MPI_Wtime();
    k::attention_fwd(ro, lse, q, kk, v, p);
    k::attention_bwd(rdq, rdk, rdv, q, kk, v, ro, lse, dout, p);
    ref_ms = (MPI_Wtime() - t0) * 1e3;
  }

  std::string out = ctx.out;
  std::unique_ptr<ResultsWriter> w;
  if (!out.empty()) w = std::make_unique<ResultsWriter>(out, *ctx.world);
  if (w) {
    w->config({{"driver", "cp_attention"}, {"deck", ctx.deck.text()}, {"deck_resolved", ctx.deck.resolved()},
               {"command_line", ctx.cmdline}, {"git_revision", ctx.git_rev}, {"format", ctx.deck.get_string("data.format")},
               {"strategy", ctx.deck.get_string("parallel.strategy")}, {"backend", drivers::device_desc(ctx.deck, cpc)},
               {"dtype", to_string(s.dt)}, {"cu_seqlens_padded", [&] {
                  std::string c;
                  for (auto x : s.global.cu_seqlens) c += (c.empty() ? "" : ",") + std::to_string(x);
                  return c;
                }()}});
    w->config_int("cp_size", s.cp);
    w->config_int("world_size", ctx.world->size());
    if (check) {
      w->tensor("/activations/reference/out", ro, "[T,H,D] global order", "1");
      w->tensor("/gradients/reference/dq", rdq, "[T,H,D] global order", "1");
      w->tensor("/gradients/reference/dk", rdk, "[T,Hkv,D] global order", "1");
      w->tensor("/gradients/reference/dv", rdv, "[T,Hkv,D] global order", "1");
    }
  }
  // bf16: outputs and gradients are rounded to bf16 at different points than the cp=1 run (per ring
  // step merges, partial dK/dV sums), a few bf16 ulps of the largest magnitude.
  const double tol = s.dt == DType::F64 ? 1e-10 : s.dt == DType::F32 ? 1e-5 : 2e-2;
  if (ctx.root()) {
    std::printf("# cp_attention: ranks=%d cp=%d format=%s tokens=%lld (%lld sequences) heads=%lld kv_heads=%lld "
                "head_dim=%lld causal=%d dtype=%s backend=%s\n",
                ctx.world->size(), s.cp, ctx.deck.get_string("data.format").c_str(), static_cast<long long>(T),
                static_cast<long long>(s.global.nseq()), static_cast<long long>(H), static_cast<long long>(Hkv),
                static_cast<long long>(D), s.base.causal ? 1 : 0, to_string(s.dt).c_str(), drivers::device_desc(ctx.deck, cpc).c_str());
    if (check) std::printf("# cp=1 reference fwd+bwd on rank 0: %.2f ms\n", ref_ms);
    std::printf("# %-9s %10s %10s %10s %10s %8s %12s %12s %10s %10s %10s %10s %5s\n", "strategy", "fwd_ms", "bwd_ms",
                "compute_ms", "comm_ms", "overlap", "bytes/rank", "model_bytes", "err_o", "err_dq", "err_dk", "err_dv",
                "pass");
  }
  bool all_pass = true;
  for (auto st : s.strategies) {
    auto c = s.base;
    c.strategy = st;
    cp::CpAttention attn(cpc, c);
    Tensor ql = cp::dcs_partition(q, s.global, s.cp, r).to(space), kl = cp::dcs_partition(kk, s.global, s.cp, r).to(space),
           vl = cp::dcs_partition(v, s.global, s.cp, r).to(space), dol = cp::dcs_partition(dout, s.global, s.cp, r).to(space);
    Tensor o = Tensor::zeros(ql.shape(), s.dt, space), dq = Tensor::zeros(ql.shape(), s.dt, space),
           dk = Tensor::zeros(kl.shape(), s.dt, space), dv = Tensor::zeros(vl.shape(), s.dt, space);
    std::vector<double> fwd_ms, bwd_ms, comp_ms, comm_ms, ring_ms;
    for (int it = 0; it < warmup + reps; ++it) {
      if (it == warmup) cpc.reset_counters();
      cpc.barrier();
      const double rw0 = drivers::ring_wait_seconds(cpc);
      double t0 = MPI_Wtime();
      attn.forward(o, ql, kl, vl);
      double t1 = MPI_Wtime();
      attn.backward(dq, dk, dv, dol);
      double t2 = MPI_Wtime();
      if (it >= warmup) {
        fwd_ms.push_back((t1 - t0) * 1e3);
        bwd_ms.push_back((t2 - t1) * 1e3);
        comp_ms.push_back((attn.fwd_times().compute + attn.bwd_times().compute) * 1e3);
        comm_ms.push_back((attn.fwd_times().comm_wait + attn.bwd_times().comm_wait) * 1e3);
        ring_ms.push_back((drivers::ring_wait_seconds(cpc) - rw0) * 1e3);
      }
    }
    std::int64_t bytes = 0;
    for (auto& [op, cnt] : cpc.counters())
      if (op != "barrier") bytes += cnt.bytes_sent;
    bytes /= reps;
    const std::string name = cp::to_string(st);
    if (w) w->comm(cpc, name + "/");  // counters of the timed iterations only
    const drivers::Overlap ov = drivers::measure_overlap(cpc, ring_ms, reps, space);
    Tensor go = host(cp::dcs_gather(cpc, o, s.global)), gdq = host(cp::dcs_gather(cpc, dq, s.global)),
           gdk = host(cp::dcs_gather(cpc, dk, s.global)), gdv = host(cp::dcs_gather(cpc, dv, s.global));
    double err[4] = {0, 0, 0, 0};
    bool pass = true;
    if (check && ctx.root()) {
      const Tensor* got[4] = {&go, &gdq, &gdk, &gdv};
      const Tensor* ref[4] = {&ro, &rdq, &rdk, &rdv};
      for (int i = 0; i < 4; ++i) {
        ErrorStats e = compare(*got[i], *ref[i]);
        // relative to the tensor's largest magnitude, so tiny elements do not dominate
        err[i] = e.max_abs / std::max(e.ref_max, 1e-300);
        pass = pass && err[i] <= tol;
      }
    }
    double passd = pass ? 1 : 0;
    ctx.world->broadcast(&passd, 1, DType::F64, 0);
    pass = passd == 1;
    all_pass = all_pass && pass;
    if (w) {
      {
        w->tensor("/activations/" + name + "/out", go, "[T,H,D] global order", "1");
        w->tensor("/gradients/" + name + "/dq", gdq, "[T,H,D] global order", "1");
        w->tensor("/gradients/" + name + "/dk", gdk, "[T,Hkv,D] global order", "1");
        w->tensor("/gradients/" + name + "/dv", gdv, "[T,Hkv,D] global order", "1");
      }
      w->timings(name + "/forward", fwd_ms);
      w->timings(name + "/backward", bwd_ms);
      w->timings(name + "/compute", comp_ms);
      w->timings(name + "/comm_wait", comm_ms);
      if (ov.ring) {
        w->timings(name + "/ring_exposed", ov.exposed_ms);
        w->timings(name + "/ring_isolated", ov.isolated_ms);
      }
      if (check) {
        const char* nm[4] = {"out", "dq", "dk", "dv"};
        for (int i = 0; i < 4; ++i) w->summary(name + "/" + nm[i], err[i] , err[i], tol, err[i] <= tol);
      }
    }
    // Slowest rank's median (the step time), bytes per rank.
    const double f = cpc.all_reduce_scalar(drivers::median(fwd_ms), ReduceOp::Max);
    const double b = cpc.all_reduce_scalar(drivers::median(bwd_ms), ReduceOp::Max);
    const double cm = cpc.all_reduce_scalar(drivers::median(comp_ms), ReduceOp::Max);
    const double cw = cpc.all_reduce_scalar(drivers::median(comm_ms), ReduceOp::Max);
    if (ctx.root())
      std::printf("  %-9s %10.3f %10.3f %10.3f %10.3f %8s %12lld %12lld %10.2e %10.2e %10.2e %10.2e %5s\n", name.c_str(), f,
                  b, cm, cw, ov.ring ? drivers::fmt_fraction(ov.fraction).c_str() : "-", static_cast<long long>(bytes),
                  static_cast<long long>(attn.model_fwd_bytes(s.dt) + attn.model_bwd_bytes(s.dt)), err[0], err[1], err[2],
                  err[3], check ? (pass ? "yes" : "NO") : "-");
  }
  if (w) w->finish();
  if (ctx.root()) {
    std::printf("# errors: max |cp - cp1| / max |cp1| per tensor; tolerance %.0e (%s)\n", tol, to_string(s.dt).c_str());
    std::printf("RESULT cp_attention %s%s%s\n", check ? (all_pass ? "PASS" : "FAIL") : "UNCHECKED",
                out.empty() ? "" : " file=", out.c_str());
  }
  if (!all_pass) throw Error("CP result differs from the cp=1 reference beyond tolerance");
}

}  // namespace

int main(int argc, char** argv) {
  DriverSpec spec;
  spec.name = "cp_attention";
  spec.description = "Attention context parallelism (p2p ring, all-gather, Ulysses a2a) against cp=1";
  spec.schema = schema();
  spec.builtin_deck = kBuiltinDeck;
  spec.default_out = "cp_attention.h5";
  spec.validate = validate;
  spec.run = run;
  return run_driver(argc, argv, spec);
}
