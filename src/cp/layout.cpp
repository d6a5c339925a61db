#include "cp/layout.hpp"

#include "core/device_ops.hpp"

#include <algorithm>
#include <cstring>

namespace hcp::cp {

void require_dcs_divisible(const SeqLayout& global, int cp, const std::string& what, Partition part) {
  part = effective_partition(part, cp);
  HCP_CHECK(cp >= 1, what, ": cp size must be >= 1");
  global.validate(what.c_str());
  const std::int64_t m = part == Partition::DCS ? 2 * cp : cp;
  for (std::int64_t s = 0; s < global.nseq(); ++s)
    HCP_CHECK(
        global.len(s) % m == 0, what, ": sequence ", s, " has length ", global.len(s), ", which must be a multiple of ",
        part == Partition::DCS ? "2*cp = " : "cp = ", m,
        part == Partition::DCS ? " for DualChunkSwap (pad it, e.g. with pack_sequences)" : " for a contiguous split");
}

SeqLayout local_layout(const SeqLayout& global, int cp, Partition part) {
  part = effective_partition(part, cp);
  require_dcs_divisible(global, cp, "local_layout", part);
  SeqLayout l = global;
  for (auto& c : l.cu_seqlens) c /= cp;
  l.real_lens.clear();  // a rank's real tokens differ by rank: local_real
  return l;
}

std::int64_t local_real(const SeqLayout& global, std::int64_t s, int cp, int rank, Partition part) {
  part = effective_partition(part, cp);
  const std::int64_t R = global.real(s), n = global.len(s);
  const auto in = [R](std::int64_t lo, std::int64_t len) { return std::clamp<std::int64_t>(R - lo, 0, len); };
  if (part == Partition::Contiguous) return in(rank * (n / cp), n / cp);
  const std::int64_t c = n / (2 * cp);
  return in(rank * c, c) + in((2 * cp - 1 - rank) * c, c);
}

void zero_pad_rows(Tensor& local, const SeqLayout& global, int cp, int rank, Partition part) {
  part = effective_partition(part, cp);
  if (!global.padded()) return;
  const SeqLayout l = local_layout(global, cp, part);
  for (std::int64_t s = 0; s < l.nseq(); ++s) {
    const std::int64_t real = local_real(global, s, cp, rank, part), pads = l.len(s) - real;
    if (pads == 0) continue;
    Tensor rows = local.slice(0, l.cu_seqlens[s] + real, pads);
    Shape shp = rows.shape();
    rows.copy_from(Tensor::zeros(shp, local.dtype(), local.space()));
  }
}

std::vector<std::int64_t> real_rows(const SeqLayout& global) {
  std::vector<std::int64_t> r;
  for (std::int64_t s = 0; s < global.nseq(); ++s)
    for (std::int64_t i = 0; i < global.real(s); ++i) r.push_back(global.cu_seqlens[s] + i);
  return r;
}
std::vector<std::int64_t> pad_rows(const SeqLayout& global) {
  std::vector<std::int64_t> r;
  for (std::int64_t s = 0; s < global.nseq(); ++s)
    for (std::int64_t i = global.real(s); i < global.len(s); ++i) r.push_back(global.cu_seqlens[s] + i);
  return r;
}
std::vector<std::int64_t> local_real_index(const SeqLayout& global, int cp, int rank, Partition part) {
  const std::vector<std::int64_t> real = real_rows(global);
  std::vector<std::int64_t> real_of(static_cast<std::size_t>(global.total()), -1);
  for (std::size_t k = 0; k < real.size(); ++k)
    real_of[static_cast<std::size_t>(real[k])] = static_cast<std::int64_t>(k);
  std::vector<std::int64_t> rows = dcs_global_index(global, cp, rank, part);
  for (auto& r : rows) r = real_of[static_cast<std::size_t>(r)];
  return rows;
}
Tensor take_rows(const Tensor& t, const std::vector<std::int64_t>& rows) {
  Shape shp = t.shape();
  shp[0] = static_cast<std::int64_t>(rows.size());
  Tensor out = Tensor::zeros(shp, t.dtype(), t.space());
  std::vector<std::int64_t> dst(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) dst[i] = static_cast<std::int64_t>(i);
  if (!rows.empty()) copy_rows(out, t, dst, rows);
  return out;
}

std::vector<std::int64_t> dcs_global_index(const SeqLayout& global, int cp, int rank, Partition part) {
  part = effective_partition(part, cp);
  require_dcs_divisible(global, cp, "dcs_global_index", part);
  HCP_CHECK(rank >= 0 && rank < cp, "dcs: rank ", rank, " outside [0, ", cp, ")");
  std::vector<std::int64_t> idx;
  idx.reserve(static_cast<std::size_t>(global.total() / cp));
  for (std::int64_t s = 0; s < global.nseq(); ++s) {
    if (part == Partition::Contiguous) {
      const std::int64_t n = global.len(s) / cp, base = global.cu_seqlens[s] + rank * n;
      for (std::int64_t j = 0; j < n; ++j) idx.push_back(base + j);
      continue;
    }
    const std::int64_t c = global.len(s) / (2 * cp), base = global.cu_seqlens[s];
    for (std::int64_t chunk : {static_cast<std::int64_t>(rank), static_cast<std::int64_t>(2 * cp - 1 - rank)})
      for (std::int64_t j = 0; j < c; ++j) idx.push_back(base + chunk * c + j);
  }
  return idx;
}

std::vector<std::int64_t> dcs_positions(const SeqLayout& global, int cp, int rank) {
  auto idx = dcs_global_index(global, cp, rank);
  std::size_t k = 0;
  for (std::int64_t s = 0; s < global.nseq(); ++s)
    for (std::int64_t j = 0; j < global.len(s) / cp; ++j, ++k) idx[k] -= global.cu_seqlens[s];
  return idx;
}

std::vector<std::int64_t> dcs_rank_major_index(const SeqLayout& global, int cp, Partition part) {
  part = effective_partition(part, cp);
  std::vector<std::int64_t> all;
  for (int r = 0; r < cp; ++r) {
    auto i = dcs_global_index(global, cp, r, part);
    all.insert(all.end(), i.begin(), i.end());
  }
  return all;
}

namespace {
// out[dst[i]] = in[src[i]] rows (row = product of trailing axes), contiguous tensors.
void permute_rows(Tensor& out, const Tensor& in, const std::vector<std::int64_t>& src,
                  const std::vector<std::int64_t>& dst) {
  HCP_CHECK(in.is_contiguous() && out.is_contiguous(), "dcs: tensors must be contiguous");
  const std::size_t row =
      static_cast<std::size_t>(in.numel() / std::max<std::int64_t>(in.size(0), 1)) * dtype_size(in.dtype());
  if (in.space() == Space::Cuda || out.space() == Space::Cuda) {
    HCP_CHECK(in.space() == out.space(), "dcs: row permutation across memory spaces");
    device_ops()->copy_rows(out.raw(), in.raw(), dst.data(), src.data(), static_cast<std::int64_t>(src.size()), row);
    return;
  }
  const char* ip = static_cast<const char*>(in.raw());
  char* op = static_cast<char*>(out.raw());
  for (std::size_t i = 0; i < src.size(); ++i)
    std::memcpy(op + static_cast<std::size_t>(dst[i]) * row, ip + static_cast<std::size_t>(src[i]) * row, row);
}
std::vector<std::int64_t> iota(std::size_t n) {
  std::vector<std::int64_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::int64_t>(i);
  return v;
}
Shape with_rows(const Tensor& t, std::int64_t rows) {
  Shape s = t.shape();
  s[0] = rows;
  return s;
}
}  // namespace

void copy_rows(Tensor& out, const Tensor& in, const std::vector<std::int64_t>& dst_rows,
               const std::vector<std::int64_t>& src_rows) {
  HCP_CHECK(dst_rows.size() == src_rows.size(), "copy_rows: ", dst_rows.size(), " destination and ", src_rows.size(),
            " source rows");
  HCP_CHECK(in.dtype() == out.dtype() && in.numel() / std::max<std::int64_t>(in.size(0), 1) ==
                                             out.numel() / std::max<std::int64_t>(out.size(0), 1),
            "copy_rows: tensors of different row shape or dtype");
  if (!src_rows.empty()) permute_rows(out, in, src_rows, dst_rows);
}

Tensor dcs_partition(const Tensor& g, const SeqLayout& global, int cp, int rank, Partition part) {
  part = effective_partition(part, cp);
  HCP_CHECK(g.dim() >= 1 && g.size(0) == global.total(), "dcs_partition: tensor has ", g.dim() ? g.size(0) : 0,
            " tokens, layout ", global.total());
  auto idx = dcs_global_index(global, cp, rank, part);
  Tensor out = Tensor::empty(with_rows(g, static_cast<std::int64_t>(idx.size())), g.dtype(), g.space());
  permute_rows(out, g, idx, iota(idx.size()));
  return out;
}

Tensor dcs_undo(const Tensor& rm, const SeqLayout& global, int cp, Partition part) {
  part = effective_partition(part, cp);
  HCP_CHECK(rm.dim() >= 1 && rm.size(0) == global.total(), "dcs_undo: token count mismatch");
  auto idx = dcs_rank_major_index(global, cp, part);
  Tensor out = Tensor::empty(rm.shape(), rm.dtype(), rm.space());
  permute_rows(out, rm, iota(idx.size()), idx);
  return out;
}

Tensor dcs_redo(const Tensor& g, const SeqLayout& global, int cp, Partition part) {
  part = effective_partition(part, cp);
  HCP_CHECK(g.dim() >= 1 && g.size(0) == global.total(), "dcs_redo: token count mismatch");
  auto idx = dcs_rank_major_index(global, cp, part);
  Tensor out = Tensor::empty(g.shape(), g.dtype(), g.space());
  permute_rows(out, g, idx, iota(idx.size()));
  return out;
}

Tensor dcs_gather(Communicator& comm, const Tensor& local, const SeqLayout& global, Partition part) {
  const int cp = comm.size();
  HCP_CHECK(local.size(0) * cp == global.total(), "dcs_gather: ", local.size(0), " local tokens x cp ", cp,
            " != ", global.total(), " global tokens");
  Tensor c = local.is_contiguous() ? local : local.clone();
  Tensor rm = Tensor::empty(with_rows(local, global.total()), local.dtype(), local.space());
  comm.all_gather(c, rm);
  return dcs_undo(rm, global, cp, part);
}

Tensor cp2hp(Communicator& comm, const Tensor& x, const SeqLayout& global, Partition part) {
  const int cp = comm.size();
  HCP_CHECK(x.dim() >= 2 && x.is_contiguous(), "cp2hp: need a contiguous [Tl, C, ...] tensor");
  const std::int64_t tl = x.size(0), C = x.numel() / tl;
  HCP_CHECK(C % cp == 0, "cp2hp: ", C, " channels are not divisible by cp = ", cp);
  HCP_CHECK(tl * cp == global.total(), "cp2hp: ", tl, " local tokens x cp ", cp, " != ", global.total());
  if (cp == 1) return x.view({tl, C});  // one rank: local order is global order, nothing moves
  const std::int64_t cb = C / cp;
  Tensor x2 = x.view({tl, cp, cb});
  Tensor send = Tensor::empty({cp, tl, cb}, x.dtype(), x.space()),
         recv = Tensor::empty({cp, tl, cb}, x.dtype(), x.space());
  for (int r = 0; r < cp; ++r) send.slice(0, r, 1).view({tl, 1, cb}).copy_from(x2.slice(1, r, 1));
  comm.all_to_all(send, recv);
  return dcs_undo(recv.view({cp * tl, cb}), global, cp, part);
}

Tensor hp2cp(Communicator& comm, const Tensor& xh, const SeqLayout& global, Partition part) {
  const int cp = comm.size();
  HCP_CHECK(xh.dim() >= 2 && xh.size(0) == global.total(), "hp2cp: need [T, C/cp] with T = ", global.total());
  const std::int64_t T = xh.size(0), cb = xh.numel() / T, tl = T / cp;
  if (cp == 1) return xh.is_contiguous() ? xh.view({T, cb}) : xh.clone().view({T, cb});
  Tensor send = dcs_redo(xh.view({T, cb}), global, cp, part).view({cp, tl, cb});
  Tensor recv = Tensor::empty({cp, tl, cb}, xh.dtype(), xh.space());
  comm.all_to_all(send, recv);
  Tensor out = Tensor::empty({tl, cp, cb}, xh.dtype(), xh.space());
  for (int r = 0; r < cp; ++r) out.slice(1, r, 1).copy_from(recv.slice(0, r, 1).view({tl, 1, cb}));
  return out.view({tl, cp * cb});
}

PackedBatch pack_sequences(const std::vector<std::vector<std::int64_t>>& seqs, int cp, std::int64_t pad_id,
                           std::int64_t ignore) {
  HCP_CHECK(cp >= 1, "pack_sequences: cp must be >= 1");
  HCP_CHECK(!seqs.empty(), "pack_sequences: no sequences");
  PackedBatch b;
  std::vector<std::int64_t> cu{0};
  for (const auto& s : seqs) {
    HCP_CHECK(!s.empty(), "pack_sequences: empty sequence");
    const std::int64_t n = static_cast<std::int64_t>(s.size());
    const std::int64_t padded = dcs_padded_len(n, cp);
    for (std::int64_t i = 0; i < padded; ++i) {
      b.tokens.push_back(i < n ? s[static_cast<std::size_t>(i)] : pad_id);
      const bool lab = i + 1 < n;
      b.labels.push_back(lab ? s[static_cast<std::size_t>(i + 1)] : ignore);
      b.label_tokens += lab ? 1 : 0;
    }
    b.seq_lens.push_back(n);
    cu.push_back(cu.back() + padded);
  }
  b.layout = SeqLayout::thd(cu);
  b.layout.real_lens = b.seq_lens;
  return b;
}

std::vector<std::int64_t> seq_idx_from_cu(const std::vector<std::int64_t>& cu) {
  std::vector<std::int64_t> s;
  if (cu.empty()) return s;
  s.reserve(static_cast<std::size_t>(cu.back()));
  for (std::int64_t t = 0; t < cu.back(); ++t) {
    // searchsorted(cu[1:], t, right=True): number of boundaries <= t.
    auto it = std::upper_bound(cu.begin() + 1, cu.end(), t);
    s.push_back(static_cast<std::int64_t>(it - (cu.begin() + 1)));
  }
  return s;
}

}  // namespace hcp::cp
