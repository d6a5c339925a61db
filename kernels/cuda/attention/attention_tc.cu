// Tensor-core flash attention for bf16, head_dim 64 or 128, on Hopper wgmma. One kernel per role and
// head dim; which runs is a pure function of head_dim (auto_backward; AttnParams::bwd_kernel names
// one form for bench_kernels) — the callers route other dtypes, head dims and unaligned operands to
// the general kernels (attention.cu, operands_ok).
//
// forward   fwd_ws_k (fwd.cuh, FlashAttention-3 structure): one block per (128-row query tile, head),
//           one block per SM; a producer warp loads Q and 128-key K/V tiles by TMA into mbarrier-
//           guarded stages, two consumer warpgroups of 64 rows overlap the softmax of one tile with
//           the P·V product of the previous one and take turns on the tensor cores. Online softmax in
//           the exp2 domain, fp32 LSE.
// backward  deterministic. (1) delta = rowsum(dO∘O), a warp per row (bwd_dq.cuh). Fused, what
//           layers run: (2) dkv_k, one block per (128 keys on the kv token axis, kv head), visiting
//           every (segment, head of the group, 64-row query block) that can see its keys in a fixed
//           order (bwd_dkv.cuh); it also forms dS·K per job, and two dQ warps (even and odd jobs) add
//           it to an fp32 accumulator by L2 bulk reductions, key tile after key tile in a fixed order
//           (per-block counters; the first share of a row is stored, not added, where every row gets
//           one); a producer warp loads each job's Q and dO by TMA; then (3) dq_out_k converts dQ to
//           bf16. Split (a benchmark form): dq_k, one block per (query tile, head) recomputing P from
//           the saved LSE and streaming K/V like the forward, and dkv_k on 64-key tiles without dQ,
//           Q/dO/LSE/delta double-buffered by cp.async. With few kv heads dkv_k splits
//           each group's heads over several blocks (dkv_head_splits) and dkv_sum_k adds their fp32
//           dK/dV shares in split order. Every output element has one summation order: bitwise
//           repeatable.
// Segments are the host kernels' (q/kv ranges with position offsets; causal: kv_pos0 + j <= q_pos0 + i),
// so varlen THD batches and every CP strategy's blocks run on this path unchanged. Rows without a
// visible key get o = 0, lse = -inf (the caller pre-fills rows no segment covers).
#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/attention/attention_tc.hpp"
#include "kernels/cuda/attention/bwd_dkv.cuh"
#include "kernels/cuda/attention/bwd_dq.cuh"
#include "kernels/cuda/attention/fwd.cuh"
#include "kernels/cuda/attention/plan.hpp"

namespace hcp::kernels::cuda_impl::attn_tc {
namespace {
template <class K>
void set_smem(K kernel, std::size_t bytes) {
  HCP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// The backward's kernels for head_dim D, a pure function of D: the fused dK/dV/dQ kernel at D 64 and
// 128 (with its dQ adds on two warps it is the faster form at both; benchmarks/PERFORMANCE.md).
constexpr AttnBwdKernel auto_backward(int /*D*/) { return AttnBwdKernel::Fused; }
// Head splits of the dK/dV kernel: the least divisor of the group size that gives it 512 blocks (four
// per SM of an H200, so that the causal tiles' unequal work evens out), or the whole group. A pure
// function of the shapes, so results repeat bitwise on any GPU. GQA with few kv heads needs it: at
// 2 kv heads and 8192 keys one block per (key tile, kv head) is 128 blocks, each visiting 16 heads.
int dkv_head_splits(std::int64_t blocks, int grp) {
  constexpr std::int64_t kTarget = 512;
  for (int s = 1; s < grp; ++s)
    if (grp % s == 0 && blocks * s >= kTarget) return s;
  return blocks >= kTarget ? 1 : grp;
}
// fp32 shares of a head-split dK/dV ([2][hsplit][tkv][Hkv][D]); none when hsplit is 1.
struct DkvPart {
  float* p = nullptr;
  std::int64_t n = 0;  // elements of dK (= of dV)
  int hsplit = 1;
  DkvPart(const Dims& d, std::int64_t blocks) : n(d.tkv * d.Hkv * d.D), hsplit(dkv_head_splits(blocks, d.H / d.Hkv)) {
    if (hsplit > 1) HCP_CUDA_CHECK(cudaMallocAsync(&p, static_cast<std::size_t>(2 * hsplit * n) * sizeof(float), 0));
  }
  // dK and dV from the shares (nothing to do without a split).
  void sum(bf16* dk, bf16* dv) const {
    if (hsplit > 1 && n > 0) dkv_sum_k<<<blocks_for(2 * n, 256), 256>>>(dk, dv, p, n, hsplit);
  }
  ~DkvPart() {
    if (p) cudaFreeAsync(p, 0);
  }
  DkvPart(const DkvPart&) = delete;
  DkvPart& operator=(const DkvPart&) = delete;
};

template <int D>
void fwd_d(const Fwd& a) {
  const Dims& d = a.dims;
  if (d.tkv == 0) return;  // no key: the caller's o = 0, lse = -inf stand
  Plan plan(*d.segments, kWgRows, d.tkv, false);
  if (plan.nqtiles == 0) return;
  constexpr int BN = 128, kStages = 2;
  const TensorMap qmap = make_map(a.q, d.tq, d.H * D, d.H * D, 64, 64);
  const TensorMap kmap = make_map(a.k, d.tkv, d.Hkv * D, d.Hkv * D, BN, 64);
  const TensorMap vmap = make_map(a.v, d.tkv, d.Hkv * D, d.Hkv * D, BN, 64);
  auto* kern = fwd_ws_k<D, BN, kStages>;
  constexpr std::size_t smem = fwd_ws_smem<D, BN, kStages>();
  set_smem(kern, smem);
  kern<<<static_cast<unsigned>(plan.nqtiles * d.H), 384, smem>>>(a.o, a.lse, a.v, plan.segs, plan.qtiles, d.H, d.Hkv,
                                                                 d.scale * kLog2e, d.causal, qmap, kmap, vmap);
  check_launch("attention_fwd (tensor cores)");
}

// The fused backward: dkv_k on 128-key tiles forms dQ too, then dq_out_k converts it to bf16.
// ordered = false: bench_kernels' fused_unordered form (dQ's adds in arrival order); dq_warps: the
// warps that add dQ (2; 1 in bench_kernels' fused_one_dq_warp form).
template <int D>
void bwd_fused(const Bwd& a, const float* delta, bool ordered, int dq_warps) {
  constexpr std::size_t kAlign = 1024;  // the wgmma tiles' 1024-byte alignment inside dynamic shared memory
  const Dims& d = a.dims;
  const float sl2 = d.scale * kLog2e;
  // 128 keys per block, two consumer warpgroups of 64 sharing each Q/dO job; dS^T [128 keys][kBN
  // queries] and two fp32 dQ buffers [kBN][D + 8] in shared memory; the dQ warpgroup.
  Plan plan(*d.segments, 128, d.tkv, true);
  const std::int64_t n = d.tq * d.H * D;  // fp32 dQ accumulator [tq][H][D]
  const std::size_t nsem = static_cast<std::size_t>(std::max<std::int64_t>(plan.ndqblk * d.H, 1));
  const bool store_first = ordered && dq_rows_first_from_tile0(*d.segments, d.tq, d.causal);
  float* acc = nullptr;
  unsigned* sem = nullptr;  // per (64-row block, head): the next key tile to add
  HCP_CUDA_CHECK(cudaMallocAsync(&acc, static_cast<std::size_t>(std::max<std::int64_t>(n, 1)) * sizeof(float), 0));
  HCP_CUDA_CHECK(cudaMallocAsync(&sem, nsem * sizeof(unsigned), 0));
  if (!store_first) HCP_CUDA_CHECK(cudaMemsetAsync(acc, 0, static_cast<std::size_t>(n) * sizeof(float), 0));
  HCP_CUDA_CHECK(cudaMemsetAsync(sem, 0, nsem * sizeof(unsigned), 0));
  if (plan.nktiles > 0) {
    const std::size_t smem = static_cast<std::size_t>(2 * 128 + 4 * kBN) * D * sizeof(bf16) + 4 * kBN * sizeof(float) +
                             128 * kBN * sizeof(bf16) + 2 * kBN * (D + 8) * sizeof(float) + 4 * sizeof(std::uint64_t) +
                             kSegCache * sizeof(SegD) + kAlign;
    // Q and dO as [tq][H·D] maps, boxes [64 rows][64 columns].
    const TensorMap qmap = make_map(a.q, d.tq, d.H * D, d.H * D, 64, 64);
    const TensorMap omap = make_map(a.dout, d.tq, d.H * D, d.H * D, 64, 64);
    auto* kern = dkv_k<D, 2 * kNW, true>;
    set_smem(kern, smem);
    const DkvPart part(d, plan.nktiles * d.Hkv);
    kern<<<static_cast<unsigned>(plan.nktiles * d.Hkv * part.hsplit), 64 * kNW + 128, smem>>>(
        a.dk, a.dv, a.q, a.k, a.v, a.lse, delta, a.dout, plan.segs, plan.tile_off, plan.tile_segs, d.tkv, d.H, d.Hkv,
        sl2, d.scale, d.causal, acc, sem, store_first, ordered, dq_warps, part.hsplit, part.p, qmap, omap);
    part.sum(a.dk, a.dv);
  }
  if (n > 0) dq_out_k<<<blocks_for(n / 2, 256), 256>>>(a.dq, acc, n, d.scale);
  HCP_CUDA_CHECK(cudaFreeAsync(sem, 0));
  HCP_CUDA_CHECK(cudaFreeAsync(acc, 0));
}
// The split backward: dq_k per (query tile, head), dkv_k per (64 keys, kv head).
template <int D>
void bwd_split(const Bwd& a, const float* delta) {
  constexpr int BM = 16 * kNW;
  constexpr std::size_t kAlign = 1024;
  const Dims& d = a.dims;
  const float sl2 = d.scale * kLog2e;
  Plan plan(*d.segments, BM, d.tkv, true);
  if (plan.nqtiles > 0) {
    const std::size_t smem = static_cast<std::size_t>(2 * BM + 4 * kBN) * D * sizeof(bf16) + kAlign;
    auto* kern = dq_k<D, kNW>;
    set_smem(kern, smem);
    kern<<<static_cast<unsigned>(plan.nqtiles * d.H), 32 * kNW, smem>>>(
        a.dq, a.q, a.k, a.v, a.lse, delta, a.dout, plan.segs, plan.qtiles, d.H, d.Hkv, sl2, d.scale, d.causal);
  }
  if (plan.nktiles > 0) {
    const std::size_t smem = static_cast<std::size_t>(2 * BM + 4 * kBN) * D * sizeof(bf16) + 4 * kBN * sizeof(float) +
                             kSegCache * sizeof(SegD) + kAlign;
    auto* kern = dkv_k<D, kNW, false>;
    set_smem(kern, smem);
    const DkvPart part(d, plan.nktiles * d.Hkv);
    kern<<<static_cast<unsigned>(plan.nktiles * d.Hkv * part.hsplit), 32 * kNW, smem>>>(
        a.dk, a.dv, a.q, a.k, a.v, a.lse, delta, a.dout, plan.segs, plan.tile_off, plan.tile_segs, d.tkv, d.H, d.Hkv,
        sl2, d.scale, d.causal, nullptr, nullptr, false, true, 1, part.hsplit, part.p, TensorMap{}, TensorMap{});
    part.sum(a.dk, a.dv);
  }
}

template <int D>
void bwd_d(const Bwd& a) {
  const Dims& d = a.dims;
  float* delta = nullptr;
  const std::int64_t rows = d.tq * d.H;
  HCP_CUDA_CHECK(cudaMallocAsync(&delta, static_cast<std::size_t>(std::max<std::int64_t>(rows, 1)) * sizeof(float), 0));
  if (rows > 0) delta_k<<<blocks_for(rows * 32, 256), 256>>>(delta, a.dout, a.o, rows, D);
  switch (a.kernel == AttnBwdKernel::Auto ? auto_backward(D) : a.kernel) {
    case AttnBwdKernel::Fused:
      bwd_fused<D>(a, delta, true, 2);
      break;
    case AttnBwdKernel::FusedUnordered:
      bwd_fused<D>(a, delta, false, 2);
      break;
    case AttnBwdKernel::FusedOneDqWarp:
      bwd_fused<D>(a, delta, true, 1);
      break;
    default:
      bwd_split<D>(a, delta);
      break;
  }
  check_launch("attention_bwd (tensor cores)");
  HCP_CUDA_CHECK(cudaFreeAsync(delta, 0));
}
}  // namespace

bool supported(DType dtype, std::int64_t head_dim, std::int64_t heads, std::int64_t kv_heads) {
  return dtype == DType::BF16 && (head_dim == 64 || head_dim == 128) && kv_heads > 0 && heads % kv_heads == 0;
}
bool operands_ok(std::initializer_list<const void*> tensors, std::int64_t tq, std::int64_t tkv) {
  const auto rows_ok = [](std::int64_t r) { return r >= 0 && r < (std::int64_t{1} << 31); };
  if (!rows_ok(tq) || !rows_ok(tkv)) return false;
  for (const void* p : tensors)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  return true;
}
void fwd(const Fwd& a) {
  if (a.dims.D == 64)
    fwd_d<64>(a);
  else
    fwd_d<128>(a);
}
void bwd(const Bwd& a) {
  if (a.dims.D == 64)
    bwd_d<64>(a);
  else
    bwd_d<128>(a);
}
}  // namespace hcp::kernels::cuda_impl::attn_tc
