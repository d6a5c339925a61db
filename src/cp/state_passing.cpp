#include "cp/state_passing.hpp"

#include "kernels/kernels.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

namespace hcp::cp {

namespace {
int owner_of_chunk(std::int64_t chunk, int cp, Partition part) {
  part = effective_partition(part, cp);
  if (part == Partition::Contiguous) return static_cast<int>(chunk);
  return static_cast<int>(chunk < cp ? chunk : 2 * cp - 1 - chunk);
}
std::int64_t chunks_per_seq(int cp, Partition part) { return part == Partition::DCS ? 2 * cp : cp; }

std::int64_t width(const Tensor& t) { return t.size(0) ? t.numel() / t.size(0) : 0; }
// Per-rank row lists -> element counts per rank (rows x C) and the lists concatenated in rank order.
std::vector<std::int64_t> flatten_rows(const std::vector<std::vector<std::int64_t>>& per_rank, std::int64_t C,
                                       std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> flat;
  counts.clear();
  for (const auto& rows : per_rank) {
    counts.push_back(static_cast<std::int64_t>(rows.size()) * C);
    flat.insert(flat.end(), rows.begin(), rows.end());
  }
  return flat;
}
std::vector<std::int64_t> iota_rows(std::int64_t n) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}
}  // namespace

std::vector<Piece> local_pieces(const SeqLayout& global, int cp, int rank, Partition part) {
  part = effective_partition(part, cp);
  require_dcs_divisible(global, cp, "state-passing layout", part);
  HCP_CHECK(rank >= 0 && rank < cp, "state passing: rank ", rank, " outside [0, ", cp, ")");
  const std::int64_t nch = chunks_per_seq(cp, part);
  std::vector<Piece> out;
  std::int64_t lrow = 0;
  for (std::int64_t s = 0; s < global.nseq(); ++s) {
    const std::int64_t lc = global.len(s) / nch;
    std::vector<std::int64_t> chunks{rank};
    if (part == Partition::DCS) chunks.push_back(2 * cp - 1 - rank);
    for (std::int64_t k : chunks) {
      out.push_back({s, k, nch, rank, lrow, global.cu_seqlens[s] + k * lc, lc});
      lrow += lc;
    }
  }
  return out;
}

// ------------------------------------------------------------------------------------------------
ConvHalo::ConvHalo(const SeqLayout& global, int cp, int rank, Partition part, std::int64_t halo)
    : halo_(halo), cp_(cp), rank_(rank) {
  part = effective_partition(part, cp);
  HCP_CHECK(halo >= 0, "conv halo must be >= 0");
  std::vector<std::vector<Piece>> all(static_cast<std::size_t>(cp));
  for (int q = 0; q < cp; ++q) all[static_cast<std::size_t>(q)] = local_pieces(global, cp, q, part);
  pieces_ = all[static_cast<std::size_t>(rank)];
  for (const auto& p : pieces_) tl_ += p.len;
  const std::int64_t nch = chunks_per_seq(cp, part);
  // (rank, local row) of a global token, through the piece that holds it.
  auto owner = [&](std::int64_t s, std::int64_t g) {
    const std::int64_t lc = global.len(s) / nch, off = g - global.cu_seqlens[s], k = off / lc;
    const int q = owner_of_chunk(k, cp, part);
    for (const auto& p : all[static_cast<std::size_t>(q)])
      if (p.seq == s && p.chunk == k) return std::pair<int, std::int64_t>{q, p.lrow + (g - p.gstart)};
    throw Error("state passing: no owner of token " + std::to_string(g));
  };
  // Halo tokens of a piece, in order: g in [gstart - halo, gstart) inside its sequence.
  auto halo_tokens = [&](const Piece& p, auto&& fn) {
    for (std::int64_t m = 0; m < halo_; ++m) {
      const std::int64_t g = p.gstart - halo_ + m;
      if (g >= global.cu_seqlens[p.seq]) fn(m, g);
    }
  };
  send_rows_.assign(static_cast<std::size_t>(cp), {});
  recv_rows_.assign(static_cast<std::size_t>(cp), {});
  std::int64_t e = 0;
  for (std::size_t i = 0; i < pieces_.size(); ++i) {
    const Piece& p = pieces_[i];
    ext_start_.push_back(e);
    for (std::int64_t r = 0; r < halo_ + p.len; ++r) ext_seq_.push_back(static_cast<std::int64_t>(i));
    halo_tokens(p, [&](std::int64_t m, std::int64_t g) {
      recv_rows_[static_cast<std::size_t>(owner(p.seq, g).first)].push_back(e + m);
    });
    e += halo_ + p.len;
  }
  for (std::size_t i = 0; i < pieces_.size(); ++i)
    for (std::int64_t j = 0; j < pieces_[i].len; ++j) {
      own_ext_.push_back(ext_start_[i] + halo_ + j);
      own_local_.push_back(pieces_[i].lrow + j);
    }
  for (int d = 0; d < cp; ++d)
    for (const auto& p : all[static_cast<std::size_t>(d)])
      halo_tokens(p, [&](std::int64_t, std::int64_t g) {
        auto [q, row] = owner(p.seq, g);
        if (q == rank_) send_rows_[static_cast<std::size_t>(d)].push_back(row);
      });
}

std::int64_t ConvHalo::remote_rows_sent() const {
  std::int64_t n = 0;
  for (int d = 0; d < cp_; ++d)
    if (d != rank_) n += static_cast<std::int64_t>(send_rows_[static_cast<std::size_t>(d)].size());
  return n;
}

Tensor ConvHalo::gather(Communicator& comm, const Tensor& local) const {
  HCP_CHECK(comm.size() == cp_ && comm.rank() == rank_, "ConvHalo: communicator does not match the plan");
  HCP_CHECK(local.dim() == 2 && local.size(0) == tl_ && local.is_contiguous(), "ConvHalo::gather: need [", tl_,
            ", C] contiguous, got ", shape_str(local.shape()));
  const std::int64_t C = width(local);
  const Space sp = local.space();
  std::vector<std::int64_t> sc, rc;
  const auto send_src = flatten_rows(send_rows_, C, sc), recv_dst = flatten_rows(recv_rows_, C, rc);
  const auto ns = static_cast<std::int64_t>(send_src.size()), nr = static_cast<std::int64_t>(recv_dst.size());
  Tensor send = Tensor::empty({std::max<std::int64_t>(ns, 1), C}, local.dtype(), sp);
  Tensor recv = Tensor::empty({std::max<std::int64_t>(nr, 1), C}, local.dtype(), sp);
  copy_rows(send, local, iota_rows(ns), send_src);
  comm.all_to_all_v(send.raw(), sc, recv.raw(), rc, local.dtype());
  Tensor ext = Tensor::zeros({ext_rows(), C}, local.dtype(), sp);
  copy_rows(ext, recv, recv_dst, iota_rows(nr));
  copy_rows(ext, local, own_ext_, own_local_);
  return ext;
}

Tensor ConvHalo::own_rows(const Tensor& ext) const {
  HCP_CHECK(ext.dim() == 2 && ext.size(0) == ext_rows() && ext.is_contiguous(), "ConvHalo::own_rows: need [",
            ext_rows(), ", C]");
  Tensor out = Tensor::empty({tl_, width(ext)}, ext.dtype(), ext.space());
  copy_rows(out, ext, own_local_, own_ext_);
  return out;
}

Tensor ConvHalo::expand(const Tensor& local) const {
  HCP_CHECK(local.dim() == 2 && local.size(0) == tl_ && local.is_contiguous(), "ConvHalo::expand: need [", tl_, ", C]");
  Tensor ext = Tensor::zeros({ext_rows(), width(local)}, local.dtype(), local.space());
  copy_rows(ext, local, own_ext_, own_local_);
  return ext;
}

Tensor ConvHalo::scatter_back(Communicator& comm, const Tensor& dext) const {
  HCP_CHECK(comm.size() == cp_ && comm.rank() == rank_, "ConvHalo: communicator does not match the plan");
  Tensor dlocal = own_rows(dext);
  const std::int64_t C = width(dext);
  const Space sp = dext.space();
  // The reverse of gather(): halo gradients go back where the halo rows came from.
  std::vector<std::int64_t> sc, rc;
  const auto send_src = flatten_rows(recv_rows_, C, sc), add_dst = flatten_rows(send_rows_, C, rc);
  const auto ns = static_cast<std::int64_t>(send_src.size()), nr = static_cast<std::int64_t>(add_dst.size());
  Tensor send = Tensor::empty({std::max<std::int64_t>(ns, 1), C}, dext.dtype(), sp);
  Tensor recv = Tensor::empty({std::max<std::int64_t>(nr, 1), C}, dext.dtype(), sp);
  copy_rows(send, dext, iota_rows(ns), send_src);
  comm.all_to_all_v(send.raw(), sc, recv.raw(), rc, dext.dtype());
  // Add each returned halo gradient into its row, in a fixed order (a row may come back several times).
  for (std::int64_t k = 0; k < nr; ++k) {
    Tensor dst = dlocal.slice(0, add_dst[static_cast<std::size_t>(k)], 1);
    kernels::axpy(dst, 1.0, recv.slice(0, k, 1));
  }
  return dlocal;
}

namespace {
// Calls f(sender, receiver) for every halo row that crosses ranks in one gather().
template <class F>
void for_each_remote_halo_row(const SeqLayout& global, int cp, Partition part, std::int64_t halo, F&& f) {
  part = effective_partition(part, cp);
  const std::int64_t nch = chunks_per_seq(cp, part);
  for (std::int64_t s = 0; s < global.nseq(); ++s) {
    const std::int64_t lc = global.len(s) / nch;
    for (std::int64_t k = 1; k < nch; ++k) {
      // Tokens [k*lc - need, k*lc) of the sequence, owned by the chunk each falls in.
      const std::int64_t need = std::min(halo, k * lc);
      for (std::int64_t o = k * lc - need; o < k * lc; ++o) {
        const int from = owner_of_chunk(o / lc, cp, part), to = owner_of_chunk(k, cp, part);
        if (from != to) f(from, to);
      }
    }
  }
}
}  // namespace

std::int64_t model_halo_rows(const SeqLayout& global, int cp, Partition part, std::int64_t halo) {
  std::int64_t rows = 0;
  for_each_remote_halo_row(global, cp, part, halo, [&](int, int) { ++rows; });
  return rows;
}

std::int64_t model_halo_rows_sent(const SeqLayout& global, int cp, Partition part, std::int64_t halo, int rank,
                                  bool forward_only) {
  std::int64_t rows = 0;
  for_each_remote_halo_row(global, cp, part, halo,
                           [&](int from, int to) { rows += (from == rank) + (!forward_only && to == rank); });
  return rows;
}

// ------------------------------------------------------------------------------------------------
StateExchange state_exchange_from_string(const std::string& s) {
  if (s == "auto") return StateExchange::Auto;
  if (s == "doubling") return StateExchange::Doubling;
  if (s == "allgather") return StateExchange::AllGather;
  HCP_FAIL("state scan exchange '", s, "' is not one of auto, doubling, allgather");
}
std::string to_string(StateExchange e) {
  return e == StateExchange::Auto ? "auto" : e == StateExchange::Doubling ? "doubling" : "allgather";
}

StateExchange resolve_state_exchange(const SeqLayout& global, int cp, Partition part, StateExchange e,
                                     std::int64_t pn) {
  if (e != StateExchange::Auto) return e;
  std::int64_t dbl = 0, ag = 0;  // per-rank maxima, one head
  for (int q = 0; q < cp; ++q) {
    dbl = std::max(dbl, model_state_elements_sent(global, cp, q, part, StateExchange::Doubling, 1, pn));
    ag = std::max(ag, model_state_elements_sent(global, cp, q, part, StateExchange::AllGather, 1, pn));
  }
  return dbl < ag ? StateExchange::Doubling : StateExchange::AllGather;
}

std::int64_t model_state_elements_sent(const SeqLayout& global, int cp, int rank, Partition part, StateExchange e,
                                       std::int64_t heads, std::int64_t pn, bool forward_only) {
  part = effective_partition(part, cp);
  const auto mine = local_pieces(global, cp, rank, part);
  const auto np = static_cast<std::int64_t>(mine.size());
  if (cp == 1) return 0;
  e = resolve_state_exchange(global, cp, part, e, pn);
  if (e == StateExchange::AllGather) return (cp - 1) * np * heads * (forward_only ? pn + 1 : 2 * pn + 1);
  const std::int64_t K = chunks_per_seq(cp, part);
  std::int64_t n = 0;
  const auto remote = [&](const Piece& p, std::int64_t delta) {
    const std::int64_t to = p.chunk + delta;
    return to >= 0 && to < K && owner_of_chunk(to, cp, part) != rank;
  };
  const int back = forward_only ? 0 : 1;  // the backward scan's rounds run towards earlier chunks
  for (const Piece& p : mine) {
    for (std::int64_t d = 1; d < K; d *= 2) n += (remote(p, d) + back * remote(p, -d)) * heads * (pn + 1);
    n += (remote(p, 1) + back * remote(p, -1)) * heads * pn;  // the two shifts carry states only
  }
  return n;
}

StateScan::StateScan(const SeqLayout& global, int cp, int rank, Partition part, StateExchange how, std::int64_t pn)
    : how_(resolve_state_exchange(global, cp, effective_partition(part, cp), how, pn)), cp_(cp), rank_(rank) {
  part = effective_partition(part, cp);
  const auto mine = local_pieces(global, cp, rank, part);
  np_ = static_cast<std::int64_t>(mine.size());
  K_ = chunks_per_seq(cp, part);
  for (const Piece& p : mine) {
    pos_.push_back(p.chunk);
    seq_.push_back(p.seq);
  }
  slot_.assign(static_cast<std::size_t>(global.nseq()),
               std::vector<std::int64_t>(static_cast<std::size_t>(chunks_per_seq(cp, part)), -1));
  for (int q = 0; q < cp; ++q) {
    const auto ps = local_pieces(global, cp, q, part);
    for (std::size_t i = 0; i < ps.size(); ++i)
      slot_[static_cast<std::size_t>(ps[i].seq)][static_cast<std::size_t>(ps[i].chunk)] =
          q * np_ + static_cast<std::int64_t>(i);
  }
  off_.push_back(0);
  for (const auto& seq : slot_) {
    order_.insert(order_.end(), seq.begin(), seq.end());
    off_.push_back(static_cast<std::int64_t>(order_.size()));
  }
  if (how_ == StateExchange::Doubling) {
    for (std::int64_t d = 1; d < K_; d *= 2) {
      fwd_rounds_.push_back(route(d));
      bwd_rounds_.push_back(route(-d));
    }
    fwd_shift_ = route(1);
    bwd_shift_ = route(-1);
  }
}

StateScan::Route StateScan::route(std::int64_t delta) const {
  Route r;
  r.send_counts.assign(static_cast<std::size_t>(cp_), 0);
  r.recv_counts.assign(static_cast<std::size_t>(cp_), 0);
  // (peer, sequence, position of the sending piece, local row) for each direction.
  std::vector<std::array<std::int64_t, 4>> out, in;
  for (std::int64_t i = 0; i < np_; ++i) {
    const auto s = static_cast<std::size_t>(seq_[static_cast<std::size_t>(i)]);
    const std::int64_t k = pos_[static_cast<std::size_t>(i)];
    if (k + delta >= 0 && k + delta < K_) {
      const std::int64_t peer = slot_[s][static_cast<std::size_t>(k + delta)] / np_;
      if (peer != rank_) out.push_back({peer, static_cast<std::int64_t>(s), k, i});
    }
    if (k - delta >= 0 && k - delta < K_) {
      const std::int64_t slot = slot_[s][static_cast<std::size_t>(k - delta)];
      if (slot / np_ != rank_) {
        in.push_back({slot / np_, static_cast<std::int64_t>(s), k - delta, i});
      } else {
        r.self_src.push_back(slot % np_);
        r.self_dst.push_back(i);
      }
    }
  }
  std::sort(out.begin(), out.end());
  std::sort(in.begin(), in.end());
  for (const auto& e : out) r.send_rows.push_back(e[3]), ++r.send_counts[static_cast<std::size_t>(e[0])];
  for (const auto& e : in) r.recv_rows.push_back(e[3]), ++r.recv_counts[static_cast<std::size_t>(e[0])];
  return r;
}

Tensor StateScan::exchange(Communicator& comm, const Route& r, const Tensor& src, const Tensor* init) const {
  const std::int64_t row = src.numel() / std::max<std::int64_t>(np_, 1);
  Tensor out = init ? init->clone() : Tensor::zeros(src.shape(), src.dtype(), src.space());
  Shape packed = src.shape();
  const auto packed_send = static_cast<std::int64_t>(r.send_rows.size());
  packed[0] = packed_send;
  Tensor send = Tensor::empty(packed, src.dtype(), src.space());
  packed[0] = static_cast<std::int64_t>(r.recv_rows.size());
  Tensor recv = Tensor::empty(packed, src.dtype(), src.space());
  if (!r.send_rows.empty()) copy_rows(send, src, iota_rows(packed_send), r.send_rows);
  std::vector<std::int64_t> sc(r.send_counts), rc(r.recv_counts);
  for (auto& c : sc) c *= row;
  for (auto& c : rc) c *= row;
  comm.all_to_all_v(send.raw(), sc, recv.raw(), rc, src.dtype());
  if (!r.recv_rows.empty()) copy_rows(out, recv, r.recv_rows, iota_rows(packed[0]));
  if (!r.self_src.empty()) copy_rows(out, src, r.self_dst, r.self_src);
  return out;
}

void StateScan::compose_rounds(Communicator& comm, const std::vector<Route>& rounds, Tensor& A, Tensor& B) const {
  // Hillis-Steele: after the round of distance d, piece k holds the composite of the pieces up to
  // 2d-1 places before it (after it, for the backward's rounds); what it receives was sent before
  // any piece of the round updated.
  Tensor ones = Tensor::empty(A.shape(), A.dtype(), A.space());
  ones.fill(1.0);  // the identity map, for pieces that receive nothing in a round
  for (const Route& r : rounds) {
    const Tensor Ap = exchange(comm, r, A, &ones), Bp = exchange(comm, r, B, nullptr);
    kernels::ssd_state_compose(A, B, Ap, Bp);
  }
}

Tensor StateScan::doubling_forward(Communicator& comm, const Tensor& S_local, const Tensor& a_local) {
  Tensor A = a_local.clone(), B = S_local.clone();
  compose_rounds(comm, fwd_rounds_, A, B);
  a_ = a_local.clone();
  Sin_ = exchange(comm, fwd_shift_, B, nullptr);  // S_in(k) = the state after piece k-1; 0 at k = 0
  return Sin_.clone();
}

void StateScan::doubling_backward(Communicator& comm, Tensor& dS_local, Tensor& da_local, const Tensor& dS_in) const {
  // g_k = dS_in(k) + a_k g_(k+1): the same maps, composed towards the sequence start.
  Tensor A = a_.clone(), G = dS_in.clone();
  compose_rounds(comm, bwd_rounds_, A, G);
  dS_local = exchange(comm, bwd_shift_, G, nullptr);  // dS_k = g_(k+1); 0 for a sequence's last piece
  da_local = Tensor::zeros(a_.shape(), a_.dtype(), a_.space());
  kernels::ssd_state_dot(da_local, dS_local, Sin_);  // da_k = <g_(k+1), S_in(k)>
}

Tensor StateScan::forward(Communicator& comm, const Tensor& S_local, const Tensor& a_local) {
  HCP_CHECK(comm.size() == cp_ && comm.rank() == rank_, "StateScan: communicator does not match the plan");
  HCP_CHECK(S_local.dim() == 4 && S_local.size(0) == np_ && a_local.dim() == 2 && a_local.size(0) == np_ &&
                a_local.size(1) == S_local.size(1) && S_local.dtype() == a_local.dtype() &&
                S_local.space() == a_local.space(),
            "StateScan: need S [", np_, ",H,P,N] and a [", np_, ",H] of one dtype and memory space");
  HCP_CHECK(S_local.dtype() == DType::F64 || S_local.dtype() == DType::F32, "StateScan: states must be fp32 or fp64");
  if (how_ == StateExchange::Doubling) return doubling_forward(comm, S_local, a_local);
  // Everything stays where the states live (the host, or the GPU: all-gathers through the
  // communicator, the scan as a kernel).
  const Space sp = S_local.space();
  Shape all_s = S_local.shape();
  all_s[0] *= cp_;
  S_all_ = Tensor::empty(all_s, S_local.dtype(), sp);
  a_all_ = Tensor::empty({cp_ * np_, S_local.size(1)}, S_local.dtype(), sp);
  comm.all_gather(S_local.is_contiguous() ? S_local : S_local.clone(), S_all_);
  comm.all_gather(a_local.is_contiguous() ? a_local : a_local.clone(), a_all_);
  Sin_all_ = Tensor::zeros(all_s, S_local.dtype(), sp);
  kernels::ssd_state_scan_fwd(Sin_all_, S_all_, a_all_, order_, off_);
  return Sin_all_.slice(0, rank_ * np_, np_).clone();
}

void StateScan::backward(Communicator& comm, Tensor& dS_local, Tensor& da_local, const Tensor& dS_in) const {
  if (how_ == StateExchange::Doubling) {
    HCP_CHECK(Sin_.defined(), "StateScan: backward() before forward()");
    HCP_CHECK(dS_in.shape() == Sin_.shape() && dS_in.dtype() == Sin_.dtype() && dS_in.space() == Sin_.space(),
              "StateScan::backward: dS_in must be ", shape_str(Sin_.shape()), " where the states live");
    doubling_backward(comm, dS_local, da_local, dS_in);
    return;
  }
  HCP_CHECK(Sin_all_.defined(), "StateScan: backward() before forward()");
  HCP_CHECK(dS_in.shape() == S_all_.slice(0, 0, np_).shape() && dS_in.dtype() == S_all_.dtype() &&
                dS_in.space() == S_all_.space(),
            "StateScan::backward: dS_in must be ", shape_str(S_all_.slice(0, 0, np_).shape()),
            " where the states live");
  Tensor dsin_all = Tensor::empty(S_all_.shape(), S_all_.dtype(), S_all_.space());
  comm.all_gather(dS_in.is_contiguous() ? dS_in : dS_in.clone(), dsin_all);
  Tensor dS_all = Tensor::zeros(S_all_.shape(), S_all_.dtype(), S_all_.space()),
         da_all = Tensor::zeros(a_all_.shape(), a_all_.dtype(), a_all_.space());
  kernels::ssd_state_scan_bwd(dS_all, da_all, dsin_all, Sin_all_, a_all_, order_, off_);
  dS_local = dS_all.slice(0, rank_ * np_, np_).clone();
  da_local = da_all.slice(0, rank_ * np_, np_).clone();
}

}  // namespace hcp::cp
