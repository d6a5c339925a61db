// The attention backward's dK/dV kernel, split (dQ by dq_k) or fused (dQ formed here as well).
// Private to kernels/cuda/attention/attention_tc.cu (its one translation unit).
#pragma once
#include "kernels/cuda/attention/tile.cuh"
#include "kernels/cuda/tensor_map.hpp"

namespace hcp::kernels::cuda_impl::attn_tc {
// Named barriers of the fused kernel (0 is __syncthreads): the consumers' own, and per dQ buffer an
// "empty" and a "full" one between the consumers and the dQ warp.
constexpr int kBarCons = 1, kBarEmpty = 2, kBarFull = 4;  // +buffer for the last two
constexpr int kBarDsFree = 6;                             // +warpgroup, "my reads of dS^T are done"
constexpr int kSegCache = 16;                             // segments of a key tile held in shared memory
// Registers per thread of the fused kernel's dQ warpgroup and consumers. The block starts at 168 per
// thread (65536 / 384, in steps of 8) and the consumers can only take what the dQ warpgroup gives
// up: 2 (cons - 168) <= 168 - warp. (With 32 and 240 every dQ warp traps waiting for its
// predecessor's counter, as consumers blocked in setmaxnreg.inc would make it.)
constexpr int kDqWarpRegs = 24, kDqConsRegs = 240;
static_assert(2 * (kDqConsRegs - 168) <= 168 - kDqWarpRegs,
              "setmaxnreg: the consumers take what the dQ warpgroup frees");

// Work list of one kv tile: the segments that hold any of its keys (CSR over tiles).
// NW = 8: 128 keys per block, two warpgroups of 64 keys sharing each Q/dO job.
// kDq (the fused backward; wgmma, NW = 8): the kernel also forms dQ's share of its key tile, dS·K
// (the consumers write dS^T to shared memory and multiply it by K, one warpgroup per 64 columns of
// D), and a dQ warp (a fourth warpgroup that gives its registers to the consumers) adds it in fp32 to
// dq_acc [tq][H][D] by bulk L2 reductions, in a fixed order — key tile by key tile, ascending — by
// waiting on a per (segment 64-row block, head) counter that the previous key tile of the segment
// advanced. Two fp32 buffers let the consumers run a job ahead of the adds. The jobs run from the
// last query block down (heads innermost), so that neighbouring key tiles reach a block at about the
// same time. Bitwise repeatable like the separate dQ kernel, with 5 products per tile pair instead of 7.
// A producer warp of the dQ warpgroup loads each job's rows (Q and dO by TMA, LSE and delta by loads
// and stores) into two mbarrier-guarded stages, so that the consumers meet once per job (dS^T
// complete) and a warpgroup may run into the next job's products while the other finishes its dQ
// share (it waits, on a named barrier, only before it overwrites its rows of dS^T); the consumers
// hold no load addresses. The launch bounds name a block count: setmaxnreg needs the register count
// at entry.
// dq_ordered = false drops that wait (arrival order; bench_kernels' fused_unordered form only).
// hsplit > 1 (few kv heads: too few blocks for the GPU): each block takes 1/hsplit of its group's
// heads, consecutive, and stores its dK/dV share in fp32 to dkv_part [2][hsplit][tkv][Hkv][D] (dK
// then dV), which dkv_sum_k adds in split order. Blocks are (key tile, kv head, split), split
// innermost, so a key tile's predecessor in the dQ order still has the lower block index.
template <int D, int NW, bool kDq>
__global__ void __launch_bounds__(NW * 32 + (kDq ? 128 : 0), kDq ? 1 : 0)
    dkv_k(bf16* dk, bf16* dv, const bf16* q, const bf16* k, const bf16* v, const float* lse, const float* delta,
          const bf16* dout, const SegD* segs, const std::int64_t* tile_off, const std::int64_t* tile_segs,
          std::int64_t tkv, int H, int Hkv, float sl2, float scale, bool causal, float* dq_acc, unsigned* dq_sem,
          bool dq_store_first, bool dq_ordered, int dq_warps, int hsplit, float* dkv_part,
          const __grid_constant__ TensorMap qmap, const __grid_constant__ TensorMap omap) {
  constexpr int BNk = 16 * NW, NT = 32 * NW, BQ = kBN, NT8 = BQ / 8;
  static_assert(BQ == 64 && (BNk == 64 || BNk == 128), "the product helpers take 64-row tiles");
  static_assert(!kDq || BNk == 128, "the fused dQ: 128-key tiles");
  constexpr int kDqLd = D + 8;  // fp32 row stride of a dQ buffer (8 pad floats: conflict-free stores)
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* Ks = reinterpret_cast<bf16*>(wg::align1024(smem_raw));
  bf16* Vs = Ks + BNk * D;
  bf16* Qs = Vs + BNk * D;       // [2][BQ][D]
  bf16* dOs = Qs + 2 * BQ * D;   // [2][BQ][D]
  bf16* dSs = dOs + 2 * BQ * D;  // kDq: dS^T [BNk keys][BQ queries], the M-major A operand of dS·K
  float* Ls = reinterpret_cast<float*>(dSs + (kDq ? BNk * BQ : 0));  // [2][BQ]
  float* Ds = Ls + 2 * BQ;                                           // [2][BQ]
  float* dQs = Ds + 2 * BQ;                                          // kDq: [2][BQ][kDqLd] fp32
  // kDq: the stages' mbarriers, full[2] (the producer's TMA bytes and its 32 lanes' LSE / delta
  // stores) and empty[2] (every consumer thread).
  auto* mbar = reinterpret_cast<std::uint64_t*>(dQs + (kDq ? 2 * BQ * kDqLd : 0));
  SegD* Sg = reinterpret_cast<SegD*>(mbar + (kDq ? 4 : 0));  // the tile's first kSegCache segments
  const std::int64_t tile = blockIdx.x / (static_cast<std::int64_t>(Hkv) * hsplit);
  // Work list of the tile: segments tile_segs[s_lo, s_hi). Every job reads its segment, so the first
  // kSegCache of them are copied to shared memory once (a global load per job stalled each job).
  const std::int64_t s_lo = tile_off[tile], s_hi = tile_off[tile + 1];
  const int ncache = static_cast<int>(lmin(s_hi - s_lo, kSegCache));
  for (int i = threadIdx.x; i < ncache; i += blockDim.x) Sg[i] = segs[tile_segs[s_lo + i]];
  auto seg_at = [&](std::int64_t s) -> SegD { return s - s_lo < ncache ? Sg[s - s_lo] : segs[tile_segs[s]]; };
  const int hk = static_cast<int>(blockIdx.x / hsplit % Hkv), sp = static_cast<int>(blockIdx.x % hsplit);
  const int grp = H / Hkv / hsplit, h0 = hk * (H / Hkv) + sp * grp;  // this block's heads [h0, h0 + grp)
  const std::int64_t c0 = tile * BNk;
  const int kvalid = static_cast<int>(lmin(BNk, tkv - c0));
  const std::int64_t kld = static_cast<std::int64_t>(Hkv) * D, qld = static_cast<std::int64_t>(H) * D;
  if (!kDq || threadIdx.x < NT) {  // the consumers load (kDq: the dQ warpgroup has threads from NT)
#pragma unroll
    for (int w = 0; w < BNk / 64; ++w) {
      load_rows<D, NT>(Ks + w * 64 * D, k + ((c0 + 64 * w) * Hkv + hk) * D, kld, kvalid - 64 * w);
      load_rows<D, NT>(Vs + w * 64 * D, v + ((c0 + 64 * w) * Hkv + hk) * D, kld, kvalid - 64 * w);
    }
  }
  if constexpr (kDq) {
    if (threadIdx.x == 0) {
      ptx::mbar_init(&mbar[0], 33);
      ptx::mbar_init(&mbar[1], 33);
      ptx::mbar_init(&mbar[2], NT);
      ptx::mbar_init(&mbar[3], NT);
    }
  }
  __syncthreads();  // the segment cache (kDq: and the mbarriers)

  // Jobs: (segment s of this tile's list, head h of the group, query tile starting at i).
  struct Job {
    std::int64_t s, i;
    int h;
  };
  auto first_row = [&](const SegD& g) -> std::int64_t {  // first query row that can see a key of the tile
    if (!causal) return 0;
    const std::int64_t i = first_row_seeing(g, lmax(c0 - g.kv_start, 0), true);
    // kDq: jobs on the segment's 64-row blocks, so that every key tile adds to the same blocks.
    return kDq ? i / BQ * BQ : i;
  };
  auto last_block = [&](std::int64_t s) -> std::int64_t {  // kDq: the segment's last 64-row block (-1: none)
    const std::int64_t n = seg_at(s).q_len;
    return n > 0 ? (n - 1) / BQ * BQ : -1;
  };
  // The first job at or after jb (in this kernel's order) that has rows; false when none is left.
  // Not fused: segments ascending, heads, query tiles ascending. kDq: segments descending, 64-row
  // blocks descending, heads ascending (the key tiles of a segment visit a prefix of its blocks from
  // the top, each block once per head).
  auto settle = [&](Job& jb) -> bool {
    if constexpr (kDq) {
      while (jb.s >= s_lo) {
        if (jb.i >= 0 && jb.i >= first_row(seg_at(jb.s))) return true;
        if (--jb.s >= s_lo) {
          jb.i = last_block(jb.s);
          jb.h = 0;
        }
      }
      return false;
    } else {
      while (jb.s < s_hi) {
        const SegD g = seg_at(jb.s);
        if (jb.i < g.q_len) return true;
        if (++jb.h < grp) {
          jb.i = first_row(g);
          continue;
        }
        ++jb.s;
        jb.h = 0;
        if (jb.s < s_hi) jb.i = first_row(seg_at(jb.s));
      }
      return false;
    }
  };
  auto first_job = [&]() -> Job {
    if constexpr (kDq)
      return Job{s_hi - 1, s_hi > s_lo ? last_block(s_hi - 1) : -1, 0};
    else
      return Job{s_lo, s_lo < s_hi ? first_row(seg_at(s_lo)) : 0, 0};
  };
  auto next_job = [&](const Job& jb) -> Job {
    if constexpr (kDq)
      return jb.h + 1 < grp ? Job{jb.s, jb.i, jb.h + 1} : Job{jb.s, jb.i - BQ, 0};
    else
      return Job{jb.s, jb.i + BQ, jb.h};
  };
  // A job's query rows: its segment, head, valid rows (of BQ) and first row of q / dout / lse / delta.
  struct JobRows {
    SegD g;
    int h, valid;
    std::int64_t row0;
  };
  auto job_rows = [&](const Job& jb) -> JobRows {
    const SegD g = seg_at(jb.s);
    return {g, h0 + jb.h, static_cast<int>(lmin(BQ, g.q_len - jb.i)), g.q_start + jb.i};
  };

  if constexpr (kDq) {
    namespace wg = hcp::cuda::wg;
    if (threadIdx.x >= NT) {  // the dQ warpgroup: warp 1 loads, warps 0 and 2 add dQ, the rest leave
      ptx::reg_dealloc<kDqWarpRegs>();
      const int lane = threadIdx.x & 31, dw = (threadIdx.x - NT) >> 5;
      if (dw == 1) {  // the producer warp
        Job jb = first_job();
        bool more = settle(jb);
        for (int jn = 0; more; ++jn) {
          const int b = jn & 1;
          if (jn >= 2) ptx::mbar_wait(&mbar[2 + b], ((jn >> 1) - 1) & 1);  // the consumers are done with stage b
          const auto [g, h, valid, row0] = job_rows(jb);
          for (int r = lane; r < BQ; r += 32) {
            const bool ok = r < valid;
            Ls[b * BQ + r] = ok ? lse[(row0 + r) * H + h] : 0.f;
            Ds[b * BQ + r] = ok ? delta[(row0 + r) * H + h] : 0.f;
          }
          ptx::mbar_arrive(&mbar[b]);  // release: this lane's stores
          if (lane == 0) {
            // Rows past the job's valid ones hold other segments' rows (finite; masked) or zeros.
            ptx::mbar_arrive_expect_tx(&mbar[b], 2 * BQ * D * sizeof(bf16));
#pragma unroll
            for (int hb = 0; hb < D / 64; ++hb) {
              ptx::tma_load_2d(Qs + b * BQ * D + hb * 64 * 64, &qmap, h * D + 64 * hb, static_cast<int>(row0),
                               &mbar[b]);
              ptx::tma_load_2d(dOs + b * BQ * D + hb * 64 * 64, &omap, h * D + 64 * hb, static_cast<int>(row0),
                               &mbar[b]);
            }
          }
          jb = next_job(jb);
          more = settle(jb);
        }
      }
      // dq_warps = 2: warp 0 adds the jobs of dQ buffer 0 (even jobs), warp 2 those of buffer 1, so that
      // one job's adds complete in L2 while the other's are issued (with one warp, the default before,
      // the consumers waited on its per-job round trip: 25 % of their stall samples at 8K, D 128).
      // dq_warps = 1 (bench_kernels' fused_one_dq_warp form): warp 0 adds every job.
      if (dw == 1 || dw == 3 || (dw == 2 && dq_warps == 1)) return;
      const int first = dw >> 1, step = dq_warps;  // this warp's first job (= its buffer when step is 2)
      for (int b = first; b < 2; b += step) ptx::bar_arrive(kBarEmpty + b, NT + 32);  // buffers start empty
      Job cur = first_job();
      bool have = settle(cur);
      if (first == 1 && have) {
        cur = next_job(cur);
        have = settle(cur);
      }
      for (int b = first; have; b ^= 2 - step) {
        const SegD g = seg_at(cur.s);
        const int h = h0 + cur.h;
        const int valid = static_cast<int>(lmin(BQ, g.q_len - cur.i));
        unsigned* sem = dq_sem + (g.dq_blk + cur.i / BQ) * H + h;
        const unsigned rank = static_cast<unsigned>(tile - g.kv_start / BNk);
        // dq_ordered = false (bench_kernels' fused_unordered form only): the adds land in arrival order,
        // which measures what the fixed order costs; dQ is then not bitwise repeatable.
        if (lane == 0 && dq_ordered) {  // the previous key tile's adds to this block are done
          long long spins = 0;
          while (ptx::ld_acquire(sem) != rank)
            if (++spins > (1ll << 24)) __trap();  // an order that never comes: fail instead of hanging
        }
        __syncwarp();
        ptx::bar_sync(kBarFull + b, NT + 32);  // the consumers' dS·K of this job is in buffer b
        ptx::fence_proxy_async_global();       // the previous tile's adds, observed, before this one's
        const float* src = dQs + b * BQ * kDqLd;
        float* dst = dq_acc + ((g.q_start + cur.i) * H + h) * static_cast<std::int64_t>(D);
        // dq_store_first: every row of dq_acc gets its first share from key tile 0 of its segment,
        // which stores it (dq_acc is not zeroed).
        if (dq_store_first && rank == 0) {
          for (int r = lane; r < valid; r += 32)
            ptx::bulk_store(dst + static_cast<std::int64_t>(r) * H * D, src + r * kDqLd, D * sizeof(float));
        } else {
          for (int r = lane; r < valid; r += 32)
            ptx::bulk_reduce_add(dst + static_cast<std::int64_t>(r) * H * D, src + r * kDqLd, D * sizeof(float));
        }
        ptx::bulk_commit();
        ptx::bulk_wait_read_all();
        __syncwarp();
        ptx::bar_arrive(kBarEmpty + b, NT + 32);  // buffer b may be refilled
        ptx::bulk_wait_all();                     // the adds are done in L2
        ptx::fence_proxy_async_global();
        __threadfence();
        __syncwarp();
        if (lane == 0) ptx::st_release(sem, rank + 1);
        for (int k = 0; k < step && have; ++k) {
          cur = next_job(cur);
          have = settle(cur);
        }
      }
      return;
    }
    ptx::reg_alloc<kDqConsRegs>();
  }
  // The consumers' block-wide barrier (the dQ warp does not take part in it).
  auto sync_all = [] {
    if constexpr (kDq)
      ptx::bar_sync(kBarCons, NT);
    else
      __syncthreads();
  };

  auto load_job = [&](const Job& jb, int buf) {
    const auto [g, h, valid, row0] = job_rows(jb);
    load_rows<D, NT>(Qs + buf * BQ * D, q + (row0 * H + h) * D, qld, valid);
    load_rows<D, NT>(dOs + buf * BQ * D, dout + (row0 * H + h) * D, qld, valid);
    for (int r = threadIdx.x; r < BQ; r += NT) {
      const bool ok = r < valid;
      cp_async4(Ls + buf * BQ + r, ok ? lse + (row0 + r) * H + h : lse, ok);
      cp_async4(Ds + buf * BQ + r, ok ? delta + (row0 + r) * H + h : delta, ok);
    }
  };
  Job cur = first_job();
  bool have = settle(cur);
  if (!kDq && have) load_job(cur, 0);
  cp_async_commit();
  if constexpr (kDq) {  // K and V (the consumers' own copies); the jobs come through the mbarriers
    cp_async_wait<0>();
    ptx::fence_proxy_async();
    sync_all();
  }

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tg = lane & 3, wgi = warp >> 2;
  const int r0 = warp * 16;
  // This warpgroup's 64 keys [cw, cw + 64) of K and V.
  const std::int64_t cw = c0 + 64 * wgi;
  const bf16* Kw = Ks + wgi * 64 * D;
  const bf16* Vw = Vs + wgi * 64 * D;
  float adk[D / 8][4], adv[D / 8][4];
  zero(adk);
  zero(adv);
  int buf = 0, qb = 0;  // Q/dO buffer; kDq: dQ buffer
  unsigned jn = 0;      // kDq: this job's index (stage buf, phase jn / 2)
  while (have) {
    Job nxt = next_job(cur);
    const bool more = settle(nxt);
    if constexpr (kDq) {
      ptx::mbar_wait(&mbar[buf], (jn >> 1) & 1);
    } else {
      cp_async_next_then_wait(more, [&] { load_job(nxt, buf ^ 1); });
      ptx::fence_proxy_async();
      sync_all();
    }
    const SegD g = seg_at(cur.s);
    const bf16* Qt = Qs + buf * BQ * D;
    const bf16* dOt = dOs + buf * BQ * D;
    const float* Lt = Ls + buf * BQ;
    const float* Dt = Ds + buf * BQ;
    // A warpgroup whose keys no row of the job can see (causal: the job ends before its first key's
    // position; or its keys lie outside the segment) skips the job (uniform over the warpgroup).
    const bool wg_sees =
        BNk == 64 || (cw < g.kv_start + g.kv_len && cw + 64 > g.kv_start &&
                      (!causal || g.kv_pos0 + lmax(cw - g.kv_start, 0) <= g.q_pos0 + lmin(cur.i + BQ, g.q_len) - 1));
    if (wg_sees) {
      float st[NT8][4], dpt[NT8][4];
      mm_xyt<D>(st, Kw, Qt);    // S^T: keys x queries
      mm_xyt<D>(dpt, Vw, dOt);  // dP^T
      // Key j (segment-local) of this thread's two rows; query i of each column.
      std::int64_t jl[2];
      bool kin[2];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const std::int64_t cg = c0 + r0 + gr + 8 * hf;
        jl[hf] = cg - g.kv_start;
        kin[hf] = jl[hf] >= 0 && jl[hf] < g.kv_len;
      }
      // Interior tile (uniform over the warpgroup): every key of its 64 in the segment, every query row
      // of the job valid and, when causal, seeing the last key — no per-element mask.
      const std::int64_t jlast = cw + 63 - g.kv_start;
      const bool interior = cw >= g.kv_start && jlast < g.kv_len && cur.i + BQ <= g.q_len &&
                            (!causal || g.kv_pos0 + jlast <= g.q_pos0 + cur.i);
      if (interior) {
#pragma unroll
        for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int c = nt * 8 + 2 * tg + (e & 1);
            const float p = ex2(st[nt][e] * sl2 - lse2(Lt[c]));
            st[nt][e] = p;
            dpt[nt][e] = p * (dpt[nt][e] - Dt[c]);
          }
      } else {
#pragma unroll
        for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int hf = e >> 1, c = nt * 8 + 2 * tg + (e & 1);
            const std::int64_t i = cur.i + c;
            const bool ok = kin[hf] && i < g.q_len && (!causal || g.kv_pos0 + jl[hf] <= g.q_pos0 + i);
            const float p = ok ? ex2(st[nt][e] * sl2 - lse2(Lt[c])) : 0.f;
            st[nt][e] = p;
            dpt[nt][e] = p * (dpt[nt][e] - Dt[c]);
          }
      }
      if constexpr (kDq) {  // dS^T into shared memory (bf16, as the products take it), for dS·K below
        if (jn > 0)
          ptx::bar_sync(kBarDsFree + (wgi ^ 1), NT);  // the other warpgroup's dQ product has read the last dS^T
#pragma unroll
        for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf)
            *reinterpret_cast<__nv_bfloat162*>(at<64>(dSs, r0 + gr + 8 * hf, nt * 8 + 2 * tg)) =
                __floats2bfloat162_rn(dpt[nt][2 * hf], dpt[nt][2 * hf + 1]);
      }
      mm_py<D>(adv, st, dOt);
      mm_py<D>(adk, dpt, Qt);
    } else if constexpr (kDq) {  // no key of this warpgroup seen: its rows of dS^T are zero
      if (jn > 0) ptx::bar_sync(kBarDsFree + (wgi ^ 1), NT);
#pragma unroll
      for (int nt = 0; nt < NT8; ++nt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
          *reinterpret_cast<__nv_bfloat162*>(at<64>(dSs, r0 + gr + 8 * hf, nt * 8 + 2 * tg)) =
              __floats2bfloat162_rn(0.f, 0.f);
    }
    if constexpr (kDq)  // this thread has read the stage's LSE and delta, its products Q and dO (waited)
      ptx::mbar_arrive(&mbar[2 + buf]);
    if constexpr (kDq) {
      namespace wg = hcp::cuda::wg;
      ptx::fence_proxy_async();  // this thread's dS^T stores, before the products read them
      sync_all();                // both warpgroups' rows of dS^T
      // Warpgroup w < D/64: columns [64 w, +64) of dS·K over the 128 keys (dS^T M-major, K N-major).
      float dq[32];
#pragma unroll
      for (int x = 0; x < 32; ++x) dq[x] = 0.f;
      if (wgi < D / 64) {
        wg::fence();
        const std::uint64_t da = wg::desc_mn128(dSs, 64 * 64 * sizeof(bf16));
#pragma unroll
        for (int kk = 0; kk < BNk / 16; ++kk) {  // 16 keys: +2048 bytes in dS^T and in a 64-key block of K
          const std::uint64_t db = wg::desc_mn128(Ks + (kk / 4) * 64 * D + wgi * 64 * 64, 64 * 64 * sizeof(bf16));
          wg::mma_ss<64, true, true>(dq, da + 128 * kk, db + 128 * (kk % 4));
        }
        wg::commit();
        wg::wait<0>();
      }
      if (more) ptx::bar_arrive(kBarDsFree + wgi, NT);  // this warpgroup's reads of dS^T are done
      ptx::bar_sync(kBarEmpty + qb, NT + 32);           // the dQ warp has read this buffer's previous job
      if (wgi < D / 64) {
        float* o = dQs + qb * BQ * kDqLd + 64 * wgi;
        const int row = (warp & 3) * 16 + gr;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf)
            *reinterpret_cast<float2*>(o + (row + 8 * hf) * kDqLd + 8 * j + 2 * tg) =
                make_float2(dq[4 * j + 2 * hf], dq[4 * j + 2 * hf + 1]);
        ptx::fence_proxy_async();  // before the bulk reductions read the buffer
      }
      ptx::bar_arrive(kBarFull + qb, NT + 32);
      qb ^= 1;
    }
    if constexpr (!kDq) sync_all();
    cur = nxt;
    have = more;
    buf ^= 1;
    ++jn;
  }
  if (hsplit == 1) {
    store_rows<D>(dk + (c0 * Hkv + hk) * D, kld, kvalid, r0, adk, scale, scale);
    store_rows<D>(dv + (c0 * Hkv + hk) * D, kld, kvalid, r0, adv, 1.f, 1.f);
  } else {
    const std::int64_t part = tkv * kld;
    float* pk = dkv_part + sp * part + (c0 * Hkv + hk) * D;
    store_rows_f32<D>(pk, kld, kvalid, r0, adk, scale);
    store_rows_f32<D>(pk + hsplit * part, kld, kvalid, r0, adv, 1.f);
  }
  if constexpr (kDq) {  // complete the "empty" barriers' last generations (the dQ warp arrived on them)
    ptx::bar_sync(kBarEmpty + qb, NT + 32);
    ptx::bar_sync(kBarEmpty + (qb ^ 1), NT + 32);
  }
}

// dk, dv = the head splits' fp32 shares of dkv_k summed in split order, n elements each.
__global__ void dkv_sum_k(bf16* dk, bf16* dv, const float* part, std::int64_t n, int hsplit) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= 2 * n) return;
  const std::int64_t w = i / n, e = i % n;
  const float* p = part + w * hsplit * n + e;
  float acc = 0.f;
  for (int s = 0; s < hsplit; ++s) acc += p[s * n];
  (w == 0 ? dk : dv)[e] = __float2bfloat16(acc);
}
}  // namespace hcp::kernels::cuda_impl::attn_tc
