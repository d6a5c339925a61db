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
#include <iterator>
#include <memory>

#include "bench_ops.hpp"
#include "common.hpp"
#include "core/clock.hpp"
#include "device.hpp"
#include "harness.hpp"
#include "io/results.hpp"
#include "kernels/kernels.hpp"
#ifdef HCP_HAVE_CUDA
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

void run(DriverContext& ctx) {
  const DType dt = dtype_from_string(ctx.deck.get_string("bench.dtype"));
  const Space sp = ctx.deck.get_string("bench.device") == "cuda" ? Space::Cuda : Space::Host;
  const bool anchors = ctx.deck.get_string("bench.suite") == "anchors";
  const auto sync = [sp] {
#ifdef HCP_HAVE_CUDA
    if (sp == Space::Cuda) return cuda::synchronize();
#endif
    Kokkos::fence();
  };
  const std::int64_t sc = ctx.deck.get_int("bench.scale");
  const int warm = static_cast<int>(ctx.deck.get_int("bench.warmup")),
            reps = static_cast<int>(ctx.deck.get_int("bench.repeats"));
  std::vector<drivers::Op> ops;
  // Keep tensors alive for the closures.
  std::vector<std::shared_ptr<Tensor>> keep;
  auto T_ = [&](const Shape& s, std::uint64_t seed, double lo = -1, double hi = 1) {
    keep.push_back(std::make_shared<Tensor>(drivers::bench_tensor(s, dt, seed, lo, hi, sp)));
    return keep.back();
  };
  const drivers::Maker make = [&](const Shape& s, std::uint64_t seed, double lo, double hi) {
    return T_(s, seed, lo, hi);
  };
  // bench.variant: the attention backward's kernel forms timed side by side (auto: what layers run).
  std::vector<k::AttnBwdKernel> forms{k::AttnBwdKernel::Auto};
  const std::string variant = ctx.deck.get_string("bench.variant");
  if (variant == "all")
    forms.assign(std::begin(k::kAttnBwdKernels), std::end(k::kAttnBwdKernels));
  else if (variant != "auto")
    forms.push_back(k::attn_bwd_kernel_from_string(variant));
  if (anchors)
    drivers::anchor_ops(ops, make, dt, ctx.deck.get_string("bench.only"), forms);
  else
    drivers::small_ops(ops, make, dt, sc);

  const std::string only = ctx.deck.get_string("bench.only");
  HCP_CHECK(only.empty() || std::any_of(ops.begin(), ops.end(),
                                        [&](const drivers::Op& o) { return o.name.find(only) != std::string::npos; }),
            "bench.only = \"", only, "\" matches no op of suite \"", ctx.deck.get_string("bench.suite"), "\"");
  std::unique_ptr<ResultsWriter> w;
  if (!ctx.out.empty()) w = std::make_unique<ResultsWriter>(ctx.out, *ctx.world);
  if (w) {
    std::string backend = "host (Kokkos Serial, " + k::host_blas() + ")";
#ifdef HCP_HAVE_CUDA
    if (sp == Space::Cuda) backend = cuda::device_name();
#endif
    w->config({{"driver", "bench_kernels"},
               {"mode", sp == Space::Cuda ? "cuda" : "host"},
               {"suite", ctx.deck.get_string("bench.suite")},
               {"deck", ctx.deck.text()},
               {"command_line", ctx.cmdline},
               {"git_revision", ctx.git_rev},
               {"dtype", to_string(dt)},
               {"backend", backend}});
    w->config_int("world_size", ctx.world->size());
  }
  if (ctx.root()) {
    std::printf("# bench_kernels (%s, suite %s, one rank's figures; %d ranks ran) dtype=%s repeats=%d\n",
                sp == Space::Cuda
                    ? "cuda"
                    : (std::string(Kokkos::DefaultHostExecutionSpace::name()) + ", " + k::host_blas()).c_str(),
                ctx.deck.get_string("bench.suite").c_str(), ctx.world->size(), to_string(dt).c_str(), reps);
    std::printf("# %-28s %-42s %10s %10s %10s %10s %10s\n", "op", "shape", "median_ms", "min_ms", "max_ms",
                "GFLOP/s|GB/s", "scratch_MB");
  }
  std::size_t ran = 0;
  for (auto& op : ops) {
    if (!only.empty() && op.name.find(only) == std::string::npos) continue;
    ++ran;
#ifdef HCP_HAVE_CUDA
    std::size_t pool0 = 0;  // bytes in the device pool before the op: its scratch is the rise above them
    if (sp == Space::Cuda) {
      (void)cuda::pool_high_water(true);
      pool0 = cuda::pool_used();
    }
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
      const double t0 = now_seconds();
      op.fn();
      sync();
      ms.push_back((now_seconds() - t0) * 1e3);
    }
    double scratch = 0;
#ifdef HCP_HAVE_CUDA
    if (sp == Space::Cuda) scratch = static_cast<double>(cuda::pool_high_water(true) - pool0);
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
  if (ctx.root())
    std::printf("RESULT bench_kernels DONE ops=%zu%s%s\n", ran, ctx.out.empty() ? "" : " file=", ctx.out.c_str());
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
      .add_string("bench.variant", "auto",
                  "attention backward kernels of the anchor suite: auto (what the layers run), one form besides "
                  "it, or all forms side by side (fused_unordered: dQ's adds in arrival order, not repeatable; "
                  "fused_one_dq_warp: one warp adding dQ instead of two)",
                  {"auto", "all", "split", "fused", "fused_unordered", "fused_one_dq_warp"})
      .add_int("bench.warmup", 1, "untimed calls per op", 0)
      .add_int("bench.repeats", 5, "timed calls per op", 1)
      .add_int("bench.scale", 1, "multiplies the token count of every shape", 1, 64);
  spec.builtin_deck = kDeck;
  spec.default_out = "bench_kernels.h5";
  spec.validate = [](DriverContext& ctx) {
    const Deck& d = ctx.deck;
    const bool cuda = d.get_string("bench.device") == "cuda";
    HCP_INPUT_CHECK(cuda || d.get_string("bench.suite") != "anchors", d.where("bench.suite"),
                    "bench.suite = \"anchors\" needs bench.device = \"cuda\" (the shapes are GPU-sized)");
    HCP_INPUT_CHECK(d.get_string("bench.variant") == "auto" || d.get_string("bench.suite") == "anchors",
                    d.where("bench.variant"),
                    "bench.variant names the attention backward's forms of the anchor suite: it needs "
                    "bench.suite = \"anchors\"");
    HCP_INPUT_CHECK(cuda || d.get_string("bench.dtype") != "bf16", d.where("bench.dtype"),
                    "bench.dtype = \"bf16\" needs bench.device = \"cuda\" (the host kernels have no bf16)");
    drivers::init_gpu(cuda, "bench.device", d.where("bench.device"));
  };
  spec.run = run;
  return run_driver(argc, argv, spec);
}
