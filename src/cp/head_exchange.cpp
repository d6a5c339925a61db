#include "cp/head_exchange.hpp"

#include "core/error.hpp"
#include "cp/layout.hpp"
#include "kernels/kernels.hpp"

namespace hcp::cp {
namespace k = hcp::kernels;

KvHeadRanges kv_head_ranges(std::int64_t heads, std::int64_t kv_heads, int parts, int mine) {
  KvHeadRanges r;
  const std::int64_t hl = heads / parts, g = heads / kv_heads;
  for (int j = 0; j < parts; ++j) {
    const std::int64_t lo = j * hl / g, hi = ((j + 1) * hl - 1) / g + 1;
    r.lo.push_back(lo);
    r.n.push_back(hi - lo);
  }
  const std::int64_t n = r.n[static_cast<std::size_t>(mine)], lo = r.lo[static_cast<std::size_t>(mine)];
  bool gqa = hl % n == 0;
  for (std::int64_t i = 0; i < hl; ++i) {
    r.map.push_back((mine * hl + i) / g - lo);
    gqa = gqa && r.map.back() == i / (hl / n);
  }
  if (gqa) r.map.clear();
  return r;
}

std::vector<std::vector<std::int64_t>> inner_to_outer_rows(const SeqLayout& global, int cp, int inner, int rank) {
  const int outer = cp / inner, o = rank / inner;
  const std::vector<std::int64_t> mine = dcs_global_index(global, outer, o);
  std::vector<std::int64_t> pos(static_cast<std::size_t>(global.total()), -1);
  for (std::size_t t = 0; t < mine.size(); ++t) pos[static_cast<std::size_t>(mine[t])] = static_cast<std::int64_t>(t);
  std::vector<std::vector<std::int64_t>> dest;
  for (int i = 0; i < inner; ++i) {
    std::vector<std::int64_t> rows;
    for (std::int64_t g : dcs_global_index(global, cp, o * inner + i)) {
      const std::int64_t p = pos[static_cast<std::size_t>(g)];
      HCP_CHECK(p >= 0, "a2a+p2p: token ", g, " of inner rank ", i, " is not in outer rank ", o, "'s shard");
      rows.push_back(p);
    }
    dest.push_back(std::move(rows));
  }
  return dest;
}

HeadExchange::HeadExchange(Communicator& group, std::vector<std::int64_t> lo, std::vector<std::int64_t> n,
                           std::vector<std::vector<std::int64_t>> dest, std::int64_t rows_out)
    : group_(group), lo_(std::move(lo)), n_(std::move(n)), dest_(std::move(dest)), rows_out_(rows_out) {
  const auto p = static_cast<std::size_t>(group_.size());
  HCP_CHECK(lo_.size() == p && n_.size() == p && dest_.size() == p,
            "HeadExchange: one head range and row list per rank");
}

namespace {
std::vector<std::int64_t> iota_rows(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}
}  // namespace

Tensor HeadExchange::to_heads(const Tensor& x) const {
  const int p = group_.size(), me = group_.rank();
  const std::int64_t tl = x.size(0), D = x.size(2), nm = n_[static_cast<std::size_t>(me)];
  std::vector<std::int64_t> sc, rc, dst;
  std::int64_t ns = 0, nr = 0;
  for (int j = 0; j < p; ++j) {
    sc.push_back(tl * n_[static_cast<std::size_t>(j)] * D);
    const auto& rows = dest_[static_cast<std::size_t>(j)];
    rc.push_back(static_cast<std::int64_t>(rows.size()) * nm * D);
    dst.insert(dst.end(), rows.begin(), rows.end());
    ns += sc.back();
    nr += rc.back();
  }
  Tensor send = Tensor::empty({ns}, x.dtype()), recv = Tensor::empty({nr / (nm * D), nm * D}, x.dtype());
  for (std::int64_t j = 0, off = 0; j < p; off += sc[static_cast<std::size_t>(j)], ++j) {
    const std::int64_t nj = n_[static_cast<std::size_t>(j)];
    send.slice(0, off, tl * nj * D).view({tl, nj, D}).copy_from(x.slice(1, lo_[static_cast<std::size_t>(j)], nj));
  }
  group_.all_to_all_v(send.raw(), sc, recv.raw(), rc, x.dtype());
  Tensor out = Tensor::zeros({rows_out_, nm * D}, x.dtype());
  copy_rows(out, recv, dst, iota_rows(static_cast<std::int64_t>(dst.size())));
  return out.view({rows_out_, nm, D});
}

Tensor HeadExchange::to_tokens(const Tensor& xh, std::int64_t heads) const {
  const int p = group_.size(), me = group_.rank();
  const std::int64_t nm = xh.size(1), D = xh.size(2),
                     tl = static_cast<std::int64_t>(dest_[static_cast<std::size_t>(me)].size());
  std::vector<std::int64_t> sc, rc, src;
  std::int64_t nr = 0;
  for (int j = 0; j < p; ++j) {
    const auto& rows = dest_[static_cast<std::size_t>(j)];
    sc.push_back(static_cast<std::int64_t>(rows.size()) * nm * D);
    src.insert(src.end(), rows.begin(), rows.end());
    rc.push_back(tl * n_[static_cast<std::size_t>(j)] * D);
    nr += rc.back();
  }
  Tensor send = Tensor::empty({static_cast<std::int64_t>(src.size()), nm * D}, xh.dtype());
  copy_rows(send, xh.is_contiguous() ? xh.view({rows_out_, nm * D}) : xh.clone().view({rows_out_, nm * D}),
            iota_rows(static_cast<std::int64_t>(src.size())), src);
  Tensor recv = Tensor::empty({nr}, xh.dtype());
  group_.all_to_all_v(send.raw(), sc, recv.raw(), rc, xh.dtype());
  Tensor x = Tensor::zeros({tl, heads, D}, xh.dtype());
  for (std::int64_t j = 0, off = 0; j < p; off += rc[static_cast<std::size_t>(j)], ++j) {
    const std::int64_t lo = lo_[static_cast<std::size_t>(j)], nj = n_[static_cast<std::size_t>(j)];
    Tensor acc = x.slice(1, lo, nj).clone();
    k::axpy(acc, 1.0, recv.slice(0, off, tl * nj * D).view({tl, nj, D}));
    x.slice(1, lo, nj).copy_from(acc);
  }
  return x;
}

// out[:, i] = x[:, map[i]] (one K/V head per query head), and its adjoint: dx[:, m] = sum of the
// dout[:, i] with map[i] = m.
Tensor expand_heads(const Tensor& x, const std::vector<std::int64_t>& map) {
  const auto h = static_cast<std::int64_t>(map.size());
  Tensor out = Tensor::empty({x.size(0), h, x.size(2)}, x.dtype());
  for (std::int64_t i = 0; i < h; ++i) out.slice(1, i, 1).copy_from(x.slice(1, map[static_cast<std::size_t>(i)], 1));
  return out;
}
Tensor expand_heads_adjoint(const Tensor& dout, const std::vector<std::int64_t>& map, std::int64_t n) {
  Tensor dx = Tensor::zeros({dout.size(0), n, dout.size(2)}, dout.dtype());
  for (std::size_t i = 0; i < map.size(); ++i) {
    Tensor acc = dx.slice(1, map[i], 1).clone();
    k::axpy(acc, 1.0, dout.slice(1, static_cast<std::int64_t>(i), 1).clone());
    dx.slice(1, map[i], 1).copy_from(acc);
  }
  return dx;
}

}  // namespace hcp::cp
