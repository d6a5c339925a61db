// Host side of the tensor-core attention: the segments and tile lists a launch needs, on the device.
// Private to kernels/cuda/attention/attention_tc.cu (its one translation unit).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cuda/attention/tile.cuh"
#include "kernels/kernels.hpp"

namespace hcp::kernels::cuda_impl::attn_tc {
constexpr int kNW = 4;  // warps per block of the split backward: 64 query rows (dQ) or 64 keys (dK/dV)

// One device buffer for the small plan arrays, stream-ordered (freed after the launches that use it).
struct Plan {
  void* mem = nullptr;
  SegD* segs = nullptr;
  QTile* qtiles = nullptr;
  std::int64_t nqtiles = 0;
  std::int64_t* tile_off = nullptr;
  std::int64_t* tile_segs = nullptr;
  std::int64_t nktiles = 0;
  std::int64_t ndqblk = 0;  // 64-row query blocks over all segments
  Plan(const std::vector<AttnSegment>& in, int bm, std::int64_t tkv, bool with_kv) {
    std::vector<SegD> s;
    std::vector<QTile> qt;
    for (std::size_t i = 0; i < in.size(); ++i) {
      const auto& a = in[i];
      SegD d;
      static_cast<AttnSegment&>(d) = a;
      d.dq_blk = ndqblk;
      s.push_back(d);
      ndqblk += (std::max<std::int64_t>(a.q_len, 0) + kBN - 1) / kBN;
      for (std::int64_t i0 = 0; i0 < a.q_len; i0 += bm) qt.push_back({static_cast<std::int64_t>(i), i0});
    }
    // Heaviest query tiles (latest rows: most causal keys) first, for a better tail.
    std::stable_sort(qt.begin(), qt.end(), [&](const QTile& x, const QTile& y) {
      return s[x.seg].q_pos0 + x.i0 - s[x.seg].kv_pos0 > s[y.seg].q_pos0 + y.i0 - s[y.seg].kv_pos0;
    });
    // Per kv tile, the segments (in segment order) that hold any of its keys and have queries:
    // O(segments + tiles covered), also for packed batches of many sequences.
    std::vector<std::int64_t> off{0}, lst;
    if (with_kv) {
      nktiles = (tkv + bm - 1) / bm;
      std::vector<std::vector<std::int64_t>> per(static_cast<std::size_t>(nktiles));
      for (std::size_t i = 0; i < in.size(); ++i) {
        const auto& a = in[i];
        if (a.q_len <= 0 || a.kv_len <= 0) continue;  // no (query, key) pair: contributes nothing
        for (std::int64_t t = a.kv_start / bm; t <= (a.kv_start + a.kv_len - 1) / bm && t < nktiles; ++t)
          per[static_cast<std::size_t>(t)].push_back(static_cast<std::int64_t>(i));
      }
      for (const auto& v : per) {
        lst.insert(lst.end(), v.begin(), v.end());
        off.push_back(static_cast<std::int64_t>(lst.size()));
      }
    }
    nqtiles = static_cast<std::int64_t>(qt.size());
    const std::size_t b_seg = s.size() * sizeof(SegD), b_qt = qt.size() * sizeof(QTile),
                      b_off = off.size() * sizeof(std::int64_t), b_lst = lst.size() * sizeof(std::int64_t);
    std::vector<unsigned char> host(b_seg + b_qt + b_off + b_lst + 8);
    std::memcpy(host.data(), s.data(), b_seg);
    std::memcpy(host.data() + b_seg, qt.data(), b_qt);
    std::memcpy(host.data() + b_seg + b_qt, off.data(), b_off);
    if (b_lst) std::memcpy(host.data() + b_seg + b_qt + b_off, lst.data(), b_lst);
    HCP_CUDA_CHECK(cudaMallocAsync(&mem, host.size(), 0));
    HCP_CUDA_CHECK(cudaMemcpyAsync(mem, host.data(), host.size(), cudaMemcpyHostToDevice, 0));
    auto* base = static_cast<unsigned char*>(mem);
    segs = reinterpret_cast<SegD*>(base);
    qtiles = reinterpret_cast<QTile*>(base + b_seg);
    tile_off = reinterpret_cast<std::int64_t*>(base + b_seg + b_qt);
    tile_segs = reinterpret_cast<std::int64_t*>(base + b_seg + b_qt + b_off);
    // From pageable memory the copy has read `host` when cudaMemcpyAsync returns.
  }
  ~Plan() { cudaFreeAsync(mem, 0); }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
};

// Whether the segments' query rows tile [0, tq) exactly and key tile 0 of every segment sees all of
// its rows: then every row of the fused backward's dq_acc gets its first share from that tile, which
// stores it instead of adding (no zeroing pass over dq_acc).
bool dq_rows_first_from_tile0(const std::vector<AttnSegment>& segs, std::int64_t tq, bool causal) {
  std::vector<std::pair<std::int64_t, std::int64_t>> r;
  for (const auto& g : segs) {
    if (g.q_len <= 0) continue;
    if (g.kv_len <= 0 || (causal && g.kv_pos0 > g.q_pos0)) return false;
    r.emplace_back(g.q_start, g.q_len);
  }
  std::sort(r.begin(), r.end());
  std::int64_t end = 0;
  for (const auto& [start, len] : r) {
    if (start != end) return false;  // a gap or an overlap
    end = start + len;
  }
  return end == tq;
}
}  // namespace hcp::kernels::cuda_impl::attn_tc
