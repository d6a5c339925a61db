// cp_mamba: one Mamba2 mixer layer under hidden-parallel CP against cp=1: output, input gradient
// and every parameter gradient (gathered / summed), per-rank timings and the bytes of each
// all-to-all, written to HDF5.
#include <mpi.h>

#include <cstdio>
#include <memory>

#include "common.hpp"
#include "comm/process_grid.hpp"
#include "cp/layout.hpp"
#include "harness.hpp"
#include "io/results.hpp"
#include "model/mamba2.hpp"

using namespace hcp;

namespace {
const char* kDeck = R"(# Built-in deck of cp_mamba: a packed THD batch through one Mamba2 mixer.
[mamba]
hidden = 64
heads = 8          # must be divisible by cp
head_dim = 16
n_groups = 2       # n_groups % cp == 0, or cp % n_groups == 0 (groups repeated)
d_state = 16
conv = 4
chunk = 32

[data]
format = "thd"
seq_lens = "100, 37, 250"
batch = 2
seqlen = 256
dtype = "fp64"
seed = 1

[parallel]
cp_size = 0

[run]
warmup = 1
repeats = 3
check = true
)";

DeckSchema schema() {
  DeckSchema s;
  s.add_int("mamba.hidden", 64, "model width", 1)
      .add_int("mamba.heads", 8, "SSM heads (divisible by cp)", 1)
      .add_int("mamba.head_dim", 16, "head dimension P", 1)
      .add_int("mamba.n_groups", 2, "B/C groups", 1)
      .add_int("mamba.d_state", 16, "state size N", 1)
      .add_int("mamba.conv", 4, "conv1d width", 1, 16)
      .add_int("mamba.chunk", 32, "SSD chunk size", 1);
  drivers::add_cp_driver_keys(s, "100, 37, 250", 256);
  return s;
}

struct Setup {
  int cp = 1;
  SeqLayout global;
  model::Mamba2Config cfg;
  DType dt = DType::F64;
};

Setup make_setup(const DriverContext& ctx) {
  const Deck& d = ctx.deck;
  Setup s;
  s.cp = drivers::cp_size_of(d, ctx.world->size());
  s.dt = dtype_from_string(d.get_string("data.dtype"));
  s.global = drivers::global_layout(d, s.cp);

  s.cfg.hidden = d.get_int("mamba.hidden");
  s.cfg.heads = d.get_int("mamba.heads");
  s.cfg.head_dim = d.get_int("mamba.head_dim");
  s.cfg.groups = d.get_int("mamba.n_groups");
  s.cfg.d_state = d.get_int("mamba.d_state");
  s.cfg.conv = d.get_int("mamba.conv");
  s.cfg.chunk = d.get_int("mamba.chunk");
  return s;
}

void validate(DriverContext& ctx) {
  Setup s = make_setup(ctx);
  ProcessGrid g = ProcessGrid::make(*ctx.world, s.cp);
  model::Mamba2HP m(*g.cp, s.cfg, s.global);  // divisibility rules
}

void run(DriverContext& ctx) {
  Setup s = make_setup(ctx);
  ProcessGrid grid = ProcessGrid::make(*ctx.world, s.cp);
  Communicator& cpc = *grid.cp;
  auto self = ctx.world->split(ctx.world->rank(), 0);
  const int r = grid.cp_rank;
  const std::int64_t T = s.global.total(), C = s.cfg.hidden;
  const auto seed = static_cast<std::uint64_t>(ctx.deck.get_int("data.seed"));
  model::ParamMap p = model::mamba2_init(s.cfg, s.dt, seed);
  Tensor h = Tensor::empty({T, C}, s.dt), dy = Tensor::empty({T, C}, s.dt);
  fill_uniform(h, seed * 7 + 1);
  fill_uniform(dy, seed * 7 + 2);
  const bool check = ctx.deck.get_bool("run.check");
  const int warm = static_cast<int>(ctx.deck.get_int("run.warmup")), reps = static_cast<int>(ctx.deck.get_int("run.repeats"));

  Tensor ry, rdh;
  model::ParamMap rg;
  double ref_ms = 0;
  if (check && ctx.root()) {
    model::Mamba2HP ref(*self, s.cfg, s.global);
    ry = Tensor::zeros({T, C}, s.dt);
    rdh = Tensor::zeros({T, C}, s.dt);
    const double t0 = MPI_Wtime();
    ref.forward(ry, h, p);
    ref.backward(rdh, rg, dy, p);
    ref_ms = (MPI_Wtime() - t0) * 1e3;
  }
  model::Mamba2HP layer(cpc, s.cfg, s.global);
  Tensor hl = cp::dcs_partition(h, s.global, s.cp, r), dyl = cp::dcs_partition(dy, s.global, s.cp, r);
  Tensor y = Tensor::zeros(hl.shape(), s.dt), dh = Tensor::zeros(hl.shape(), s.dt);
  model::ParamMap grads;
  std::vector<double> fwd_ms, bwd_ms;
  for (int it = 0; it < warm + reps; ++it) {
    if (it == warm) cpc.reset_counters();
    cpc.barrier();
    const double t0 = MPI_Wtime();
    layer.forward(y, hl, p);
    const double t1 = MPI_Wtime();
    layer.backward(dh, grads, dyl, p);
    const double t2 = MPI_Wtime();
    if (it >= warm) {
      fwd_ms.push_back((t1 - t0) * 1e3);
      bwd_ms.push_back((t2 - t1) * 1e3);
    }
  }
  const auto& cnt = cpc.counters();
  const std::int64_t a2a = cnt.count("all_to_all") ? cnt.at("all_to_all").bytes_sent / reps : 0;
  const std::int64_t ar = cnt.count("all_reduce") ? cnt.at("all_reduce").bytes_sent / reps : 0;
  // Cost model of the all-to-alls: (cp-1)/cp of the moved local tensors, forward and backward alike:
  // x (d_inner), B and C (G*N each, times the repeat factor), dt (H) in; y (d_inner) out.
  const std::int64_t Tl = T / s.cp, G = s.cfg.groups, rep = G < s.cp ? s.cp / G : 1;
  const std::int64_t per_tok = 2 * s.cfg.d_inner() + 2 * G * rep * s.cfg.d_state + s.cfg.heads;
  const std::int64_t model_a2a = 2 * (s.cp - 1) * Tl * per_tok / s.cp * static_cast<std::int64_t>(dtype_size(s.dt));
  std::unique_ptr<ResultsWriter> w;
  if (!ctx.out.empty()) w = std::make_unique<ResultsWriter>(ctx.out, *ctx.world);
  if (w) w->comm(cpc, "mamba_hp/");
  Tensor gy = cp::dcs_gather(cpc, y, s.global), gdh = cp::dcs_gather(cpc, dh, s.global);
  const double tol = s.dt == DType::F64 ? 1e-10 : 1e-5;
  double worst = 0;
  std::vector<std::pair<std::string, double>> errs;
  if (check && ctx.root()) {
    auto rel = [](const Tensor& a, const Tensor& b) {
      ErrorStats e = compare(a, b);
      return e.max_abs / std::max(e.ref_max, 1e-300);
    };
    errs.push_back({"y", rel(gy, ry)});
    errs.push_back({"dh", rel(gdh, rdh)});
    for (auto& [n, t] : rg) errs.push_back({"d" + n, rel(grads.at(n), t)});
    for (auto& e : errs) worst = std::max(worst, e.second);
  }
  double pass = worst <= tol ? 1 : 0;
  ctx.world->broadcast(&pass, 1, DType::F64, 0);
  if (w) {
    w->config({{"driver", "cp_mamba"}, {"deck", ctx.deck.text()}, {"deck_resolved", ctx.deck.resolved()},
               {"command_line", ctx.cmdline}, {"git_revision", ctx.git_rev}, {"format", ctx.deck.get_string("data.format")},
               {"strategy", "hidden_parallel"}, {"backend", "host/" + cpc.backend()}, {"dtype", to_string(s.dt)}});
    w->config_int("cp_size", s.cp);
    w->config_int("world_size", ctx.world->size());
    w->tensor("/activations/mamba/out", gy, "[T,hidden] global order", "1");
    w->tensor("/gradients/input", gdh, "[T,hidden] global order", "1");
    for (auto& [n, t] : grads) w->tensor("/gradients/" + n, t, "parameter shape", "1");
    if (check) {
      w->tensor("/activations/reference/out", ry, "[T,hidden] global order", "1");
      for (auto& [n, e] : errs) w->summary(n, e, e, tol, e <= tol);
    }
    w->timings("mamba_hp/forward", fwd_ms);
    w->timings("mamba_hp/backward", bwd_ms);
    w->finish();
  }
  const double f = cpc.all_reduce_scalar(drivers::median(fwd_ms), ReduceOp::Max);
  const double b = cpc.all_reduce_scalar(drivers::median(bwd_ms), ReduceOp::Max);
  if (ctx.root()) {
    std::printf("# cp_mamba: ranks=%d cp=%d format=%s tokens=%lld (%lld sequences) hidden=%lld heads=%lld head_dim=%lld "
                "n_groups=%lld d_state=%lld chunk=%lld dtype=%s backend=host/%s\n",
                ctx.world->size(), s.cp, ctx.deck.get_string("data.format").c_str(), static_cast<long long>(T),
                static_cast<long long>(s.global.nseq()), static_cast<long long>(C), static_cast<long long>(s.cfg.heads),
                static_cast<long long>(s.cfg.head_dim), static_cast<long long>(G), static_cast<long long>(s.cfg.d_state),
                static_cast<long long>(s.cfg.chunk), to_string(s.dt).c_str(), cpc.backend().c_str());
    if (check) std::printf("# cp=1 reference fwd+bwd on rank 0: %.2f ms\n", ref_ms);
    std::printf("# %-16s %10s %10s %14s %14s %14s\n", "strategy", "fwd_ms", "bwd_ms", "a2a_bytes/rank", "model_a2a",
                "allreduce_B");
    std::printf("  %-16s %10.3f %10.3f %14lld %14lld %14lld\n", "hidden_parallel", f, b, static_cast<long long>(a2a),
                static_cast<long long>(model_a2a), static_cast<long long>(ar));
    if (check) {
      std::printf("# max |cp - cp1| / max |cp1|:");
      for (auto& [n, e] : errs) std::printf(" %s=%.1e", n.c_str(), e);
      std::printf("\n");
    }
    std::printf("RESULT cp_mamba %s%s%s\n", check ? (pass == 1 ? "PASS" : "FAIL") : "UNCHECKED",
                ctx.out.empty() ? "" : " file=", ctx.out.c_str());
  }
  if (pass != 1) throw Error("CP result differs from the cp=1 reference beyond tolerance");
}
}  // namespace

int main(int argc, char** argv) {
  DriverSpec spec;
  spec.name = "cp_mamba";
  spec.description = "Mamba2 mixer with hidden-parallel context parallelism against cp=1";
  spec.schema = schema();
  spec.builtin_deck = kDeck;
  spec.default_out = "cp_mamba.h5";
  spec.validate = validate;
  spec.run = run;
  return run_driver(argc, argv, spec);
}
