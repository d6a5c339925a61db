// The attention forward (bf16, head_dim 64 / 128, Hopper): fwd_ws_k.
// Private to kernels/cuda/attention/attention_tc.cu (its one translation unit).
#pragma once
#include "kernels/cuda/attention/tile.cuh"
#include "kernels/cuda/tensor_map.hpp"

namespace hcp::kernels::cuda_impl::attn_tc {
constexpr int kWgRows = 128;  // query rows per block
// One block per (128-row query tile, head), one block per SM, 384 threads. Warpgroup 0 hands its
// registers to the others (setmaxnreg) and one of its warps produces: Q once by TMA, then per K/V tile
// of BN keys K and V by TMA into rings of S stages (2; 3 fit at D = 128 and measure the same), each stage guarded by a
// "full" and an "empty" mbarrier; K_t goes out with V_{t-1}, which a consumer needs together. A segment's last V tile,
// when partial, is loaded by that warp with the keys past the segment zeroed (their P is 0, which must not meet a
// non-finite value; K needs no care: S is masked there). Warpgroups 1 and 2 consume 64 query rows each: in iteration t
// a consumer issues S_t = Q·K_t^T and O += P_{t-1}·V_{t-1} back to back, works the softmax of S_t while the second
// product still runs, and rescales O once it is done (P_{t-1} waits in registers as bf16); the two
// consumers take turns to issue (two named barriers), so that one's softmax runs under the other's
// products. Both consumers walk all the block's K/V tiles (a warpgroup's tiles past its rows' last
// visible key are masked out), which keeps the turns paired.
constexpr int kWsProdRegs = 24, kWsConsRegs = 240;
static_assert(2 * (kWsConsRegs - 168) <= 168 - kWsProdRegs, "setmaxnreg: the consumers take what the producers free");
constexpr int kBarTurn = 1;  // +consumer warpgroup: "your turn to issue products"
template <int D, int BN, int S>
constexpr std::size_t fwd_ws_smem() {
  return static_cast<std::size_t>(kWgRows + 2 * S * BN) * D * sizeof(bf16) + (1 + 4 * S) * sizeof(std::uint64_t) + 1024;
}
template <int D, int BN, int S>
__global__ void __launch_bounds__(384, 1)
    fwd_ws_k(bf16* o, float* lse, const bf16* v, const SegD* segs, const QTile* tiles, int H, int Hkv, float sl2,
             bool causal, const __grid_constant__ TensorMap qmap, const __grid_constant__ TensorMap kmap,
             const __grid_constant__ TensorMap vmap) {
  namespace wg = hcp::cuda::wg;
  constexpr int BM = kWgRows, NT8 = BN / 8;
  constexpr unsigned kTileBytes = BN * D * sizeof(bf16);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(wg::align1024(smem_raw));  // [2][D/64][64][64]
  bf16* Ks = Qs + BM * D;                                       // [S][D/64][BN][64]
  bf16* Vs = Ks + S * BN * D;                                   // [S][D/64][BN][64]
  auto* bars = reinterpret_cast<std::uint64_t*>(Vs + S * BN * D);
  std::uint64_t *q_full = bars, *k_full = bars + 1, *v_full = k_full + S, *k_empty = v_full + S, *v_empty = k_empty + S;
  const QTile tl = tiles[blockIdx.x / H];
  const int h = blockIdx.x % H, hk = h / (H / Hkv);
  const SegD g = segs[tl.seg];
  const std::int64_t i0 = tl.i0;
  const int qvalid = static_cast<int>(lmin(BM, g.q_len - i0));
  const int ntiles = static_cast<int>((keys_seen_by_rows(g, i0, BM, causal) + BN - 1) / BN);
  if (threadIdx.x == 0) {
    ptx::mbar_init(q_full, 1);
#pragma unroll
    for (int st = 0; st < S; ++st) {
      ptx::mbar_init(&k_full[st], 1);   // the producer's expect_tx; the TMA bytes
      ptx::mbar_init(&v_full[st], 32);  // every producer lane (TMA bytes, or its stores of a partial tile)
      ptx::mbar_init(&k_empty[st], 8);  // one lane per consumer warp
      ptx::mbar_init(&v_empty[st], 8);
    }
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp < 4) {  // the producer warpgroup
    ptx::reg_dealloc<kWsProdRegs>();
    if (warp != 0) return;
    if (lane == 0) {
      ptx::mbar_arrive_expect_tx(q_full, BM * D * sizeof(bf16));
#pragma unroll
      for (int w = 0; w < 2; ++w)
#pragma unroll
        for (int hb = 0; hb < D / 64; ++hb)
          ptx::tma_load_2d(Qs + (w * (D / 64) + hb) * 64 * 64, &qmap, h * D + 64 * hb,
                           static_cast<int>(g.q_start + i0 + 64 * w), q_full);
    }
    const std::int64_t kld = static_cast<std::int64_t>(Hkv) * D;
    // Tile t's stage, its first key row, and the phase in which the consumers released the stage's
    // previous tile (t - S).
    const auto stage = [&](int t) { return t % S; };
    const auto row_of = [&](int t) { return static_cast<int>(g.kv_start + static_cast<std::int64_t>(t) * BN); };
    const auto freed = [&](int t) { return static_cast<unsigned>((t / S) - 1) & 1u; };
    // K_t, then V_{t-1}: a consumer's iteration t takes both, and they need only iteration t - 2 done.
    for (int t = 0; t <= ntiles; ++t) {
      if (t < ntiles && lane == 0) {
        const int st = stage(t);
        if (t >= S) ptx::mbar_wait(&k_empty[st], freed(t));
        ptx::mbar_arrive_expect_tx(&k_full[st], kTileBytes);
#pragma unroll
        for (int hb = 0; hb < D / 64; ++hb)
          ptx::tma_load_2d(Ks + (st * (D / 64) + hb) * BN * 64, &kmap, hk * D + 64 * hb, row_of(t), &k_full[st]);
      }
      if (t == 0) continue;
      const int tv = t - 1, st = stage(tv);
      if (tv >= S) ptx::mbar_wait(&v_empty[st], freed(tv));
      bf16* vt = Vs + st * BN * D;
      const std::int64_t j0 = static_cast<std::int64_t>(tv) * BN;
      const int valid = static_cast<int>(lmin(BN, g.kv_len - j0));
      if (valid == BN) {
        if (lane == 0) {
          ptx::mbar_arrive_expect_tx(&v_full[st], kTileBytes);
#pragma unroll
          for (int hb = 0; hb < D / 64; ++hb)
            ptx::tma_load_2d(vt + hb * BN * 64, &vmap, hk * D + 64 * hb, row_of(tv), &v_full[st]);
        } else {
          ptx::mbar_arrive(&v_full[st]);
        }
      } else {
#pragma unroll
        for (int hb = 0; hb < D / 64; ++hb)
          load_tile_async<64, 32>(vt + hb * BN * 64, v + (g.kv_start + j0) * kld + hk * D + 64 * hb, kld, BN, valid);
        cp_async_commit();
        cp_async_wait<0>();
        ptx::fence_proxy_async();  // the products read the tile through the async proxy
        ptx::mbar_arrive(&v_full[st]);
      }
    }
    return;
  }
  ptx::reg_alloc<kWsConsRegs>();
  const int cw = warp - 4, wgi = cw >> 2, gr = lane >> 2;  // consumer warp, its warpgroup, fragment row
  const int r0 = cw * 16;
  const bf16* Qw = Qs + wgi * 64 * D;
  const std::int64_t qp0 = g.q_pos0 + i0 + r0 + gr;
  float acc[1][D / 8][4];
  zero(acc[0]);
  float(&oflat)[D / 2] = reinterpret_cast<float(&)[D / 2]>(acc[0]);
  float mx[1][2] = {{-INFINITY, -INFINITY}}, l[1][2] = {{0.f, 0.f}};
  unsigned pa[BN / 16][4];  // P of the previous tile, the A operand of its P·V
  const int me = kBarTurn + wgi, other = kBarTurn + (wgi ^ 1);
  // O += P_{t-1}·V_{t-1} (issued, not waited for).
  const auto issue_pv = [&](int t) {
    const bf16* Vt = Vs + (t % S) * BN * D;
    const std::uint64_t dv = wg::desc_mn128(Vt, BN * 64 * sizeof(bf16));  // N-major: D/64 blocks [BN][64]
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) wg::mma_rs<D, true>(oflat, pa[kk], dv + 128 * kk);
    wg::commit();
  };
  const auto release = [&](std::uint64_t* bar) {
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(bar);
  };
  // S_t = Q·K_t^T (issued, not waited for).
  float s[1][NT8][4];
  float(&sflat)[BN / 2] = reinterpret_cast<float(&)[BN / 2]>(s[0]);
  const auto issue_s = [&](int t) {
    const bf16* Kt = Ks + (t % S) * BN * D;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int hb = kk / 4, ks = kk % 4;  // 64-column block, k16 slice in it (+32 bytes each)
      const std::uint64_t da = wg::desc_k128(Qw + hb * 64 * 64) + 2 * ks,
                          db = wg::desc_k128(Kt + hb * BN * 64) + 2 * ks;
      if (kk == 0)
        wg::mma_ss<BN, false, false, true>(sflat, da, db);
      else
        wg::mma_ss<BN, false, false>(sflat, da, db);
    }
    wg::commit();
  };
  // The softmax of S_t (P_t in s); corr: the factors for O.
  float corr[2];
  const auto softmax = [&](int t) {
    const std::int64_t j0 = static_cast<std::int64_t>(t) * BN;
    const bool edge = j0 + BN > g.kv_len || (causal && g.kv_pos0 + j0 + BN - 1 > g.q_pos0 + i0 + r0);
    const int kv_rem = static_cast<int>(lmin(BN, g.kv_len - j0));
    const int diag = causal ? static_cast<int>(lmax(lmin(qp0 - g.kv_pos0 - j0, 1 << 20), -(1 << 20))) : (1 << 20);
    softmax_tile<NT8, 1>(s, mx, l, edge, kv_rem, diag, sl2, [&](int, int hf, float c) { corr[hf] = c; });
  };
  const auto keep_p = [&] {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) c_to_a(pa[kk], s[0][2 * kk], s[0][2 * kk + 1]);
  };
  if (wgi == 1) ptx::bar_arrive(kBarTurn, 256);  // warpgroup 0 issues first
  ptx::mbar_wait(q_full, 0);
  if (ntiles > 0) {  // tile 0: S only (O is still zero)
    ptx::mbar_wait(&k_full[0], 0);
    ptx::bar_sync(me, 256);
    wg::fence();
    issue_s(0);
    ptx::bar_arrive(other, 256);
    wg::wait<0>();
    release(&k_empty[0]);
    softmax(0);
    keep_p();
  }
  for (int t = 1; t < ntiles; ++t) {
    const int st = t % S, pst = (t - 1) % S;
    ptx::mbar_wait(&k_full[st], (t / S) & 1);
    ptx::mbar_wait(&v_full[pst], ((t - 1) / S) & 1);
    ptx::bar_sync(me, 256);
    wg::fence();
    issue_s(t);
    issue_pv(t - 1);
    ptx::bar_arrive(other, 256);
    wg::wait<1>();  // S_t
    release(&k_empty[st]);
    softmax(t);
    wg::wait<0>();  // O += P_{t-1}·V_{t-1}
    release(&v_empty[pst]);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) rescale_rows<D>(acc[0], hf, corr[hf]);
    keep_p();
  }
  if (wgi == 0) ptx::bar_sync(me, 256);  // warpgroup 1's last "your turn"
  if (ntiles > 0) {
    const int lst = (ntiles - 1) % S;
    ptx::mbar_wait(&v_full[lst], ((ntiles - 1) / S) & 1);
    wg::fence();
    issue_pv(ntiles - 1);
    wg::wait<0>();
  }
  const std::int64_t qld = static_cast<std::int64_t>(H) * D;
  finish_rows<D, 1>(acc, mx, l, o + (g.q_start + i0) * qld + static_cast<std::int64_t>(h) * D, qld, qvalid, r0,
                    lse + (g.q_start + i0) * H + h, H);
}
}  // namespace hcp::kernels::cuda_impl::attn_tc
