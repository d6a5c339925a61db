#include "cp/moe_ep.hpp"

#include <algorithm>

#include "cp/layout.hpp"

namespace hcp::cp {

namespace {
std::int64_t width(const Tensor& t) { return t.size(0) ? t.numel() / t.size(0) : (t.dim() > 1 ? t.size(1) : 0); }
}  // namespace

std::int64_t moe_ep_uniform_bytes(std::int64_t tokens, std::int64_t topk, std::int64_t hidden, int ep, DType dt) {
  const auto es = static_cast<std::int64_t>(dtype_size(dt));
  return 4 * tokens * topk * hidden * es * (ep - 1) / ep;
}

ExpertRange ep_experts(std::int64_t experts, int ep, int rank) {
  HCP_CHECK(experts % ep == 0, "expert parallelism needs moe.experts (", experts, ") divisible by the EP size (", ep,
            ")");
  return {rank * (experts / ep), experts / ep};
}

EpDispatcher::EpDispatcher(Communicator& comm, std::int64_t experts, const std::vector<std::int64_t>& counts)
    : comm_(comm), ep_(comm.size()), rank_(comm.rank()), E_(experts) {
  const ExpertRange mine = ep_experts(experts, ep_, rank_);
  HCP_CHECK(static_cast<std::int64_t>(counts.size()) == experts, "EpDispatcher: ", counts.size(), " counts for ",
            experts, " experts");
  el_ = mine.count;
  e0_ = mine.first;
  send_rows_.assign(static_cast<std::size_t>(ep_), 0);
  for (std::int64_t e = 0; e < experts; ++e) {
    send_rows_[static_cast<std::size_t>(e / el_)] += counts[static_cast<std::size_t>(e)];
    rows_ += counts[static_cast<std::size_t>(e)];
  }
  if (ep_ == 1) {  // one rank: its own rows, already expert-major; nothing is exchanged or regrouped
    local_counts_ = counts;
    local_rows_ = rows_;
    return;
  }
  // Counts first: rank q receives, from every source, that source's counts of q's experts.
  // (Counts travel as fp64: exact below 2^53.)
  std::vector<double> cs(counts.begin(), counts.end()), cr(static_cast<std::size_t>(ep_ * el_));
  comm_.all_to_all(cs.data(), cr.data(), el_, DType::F64);
  recv_counts_.assign(cr.begin(), cr.end());
  // Received rows are source-major: prefix sums over (source, local expert).
  recv_off_.assign(static_cast<std::size_t>(ep_ * el_ + 1), 0);
  for (std::size_t i = 0; i < recv_counts_.size(); ++i) recv_off_[i + 1] = recv_off_[i] + recv_counts_[i];
  local_counts_.assign(static_cast<std::size_t>(el_), 0);
  for (int s = 0; s < ep_; ++s)
    for (std::int64_t e = 0; e < el_; ++e)
      local_counts_[static_cast<std::size_t>(e)] += recv_counts_[static_cast<std::size_t>(s * el_ + e)];
  for (auto c : local_counts_) local_rows_ += c;
  // The regroup as one row map: expert-major row i <- source-major row regroup_[i].
  regroup_.reserve(static_cast<std::size_t>(local_rows_));
  ordered_.reserve(static_cast<std::size_t>(local_rows_));
  for (std::int64_t e = 0; e < el_; ++e)
    for (int s = 0; s < ep_; ++s) {
      const std::int64_t src = source_major_offset(s, e), n = recv_counts_[static_cast<std::size_t>(s * el_ + e)];
      for (std::int64_t j = 0; j < n; ++j) regroup_.push_back(src + j);
    }
  for (std::int64_t i = 0; i < local_rows_; ++i) ordered_.push_back(i);
}

std::int64_t EpDispatcher::source_major_offset(int s, std::int64_t e) const {
  return recv_off_[static_cast<std::size_t>(s * el_ + e)];
}
std::int64_t EpDispatcher::rows_from(int s) const {
  return recv_off_[static_cast<std::size_t>((s + 1) * el_)] - recv_off_[static_cast<std::size_t>(s * el_)];
}

Tensor EpDispatcher::dispatch(const Tensor& xp) const {
  HCP_CHECK(xp.dim() == 2 && xp.size(0) == rows_ && xp.is_contiguous(), "EpDispatcher::dispatch: need [", rows_,
            ", C] contiguous");
  if (ep_ == 1) return xp;  // one rank: already expert-major, nothing moves
  const std::int64_t C = width(xp);
  std::vector<std::int64_t> sc(static_cast<std::size_t>(ep_)), rc(static_cast<std::size_t>(ep_));
  for (int q = 0; q < ep_; ++q) {
    sc[static_cast<std::size_t>(q)] = send_rows_[static_cast<std::size_t>(q)] * C;
    rc[static_cast<std::size_t>(q)] = rows_from(q) * C;
  }
  Tensor recv = Tensor::empty({std::max<std::int64_t>(local_rows_, 1), C}, xp.dtype(), xp.space());
  comm_.all_to_all_v(xp.raw(), sc, recv.raw(), rc, xp.dtype());
  // Source-major (source, expert) -> expert-major (expert, source): one row copy.
  Tensor out = Tensor::empty({local_rows_, C}, xp.dtype(), xp.space());
  if (local_rows_ > 0) copy_rows(out, recv, ordered_, regroup_);
  return out;
}

Tensor EpDispatcher::combine(const Tensor& yl) const {
  HCP_CHECK(yl.dim() == 2 && yl.size(0) == local_rows_ && yl.is_contiguous(), "EpDispatcher::combine: need [",
            local_rows_, ", C] contiguous");
  if (ep_ == 1) return yl;
  const std::int64_t C = width(yl);
  // Expert-major -> source-major (one row copy), then back to the sources.
  Tensor send = Tensor::empty({std::max<std::int64_t>(local_rows_, 1), C}, yl.dtype(), yl.space());
  if (local_rows_ > 0) copy_rows(send, yl, regroup_, ordered_);
  std::vector<std::int64_t> sc(static_cast<std::size_t>(ep_)), rc(static_cast<std::size_t>(ep_));
  for (int q = 0; q < ep_; ++q) {
    sc[static_cast<std::size_t>(q)] = rows_from(q) * C;
    rc[static_cast<std::size_t>(q)] = send_rows_[static_cast<std::size_t>(q)] * C;
  }
  Tensor out = Tensor::empty({rows_, C}, yl.dtype(), yl.space());
  Tensor recv = rows_ ? out : Tensor::empty({1, C}, yl.dtype(), yl.space());
  comm_.all_to_all_v(send.raw(), sc, recv.raw(), rc, yl.dtype());
  return out;
}

}  // namespace hcp::cp
