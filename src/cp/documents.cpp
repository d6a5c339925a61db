#include "cp/documents.hpp"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "core/error.hpp"
#include "cp/layout.hpp"

namespace hcp::cp {

double DocCost::of(std::int64_t n) const {
  const double x = static_cast<double>(n);
  return pair * (causal ? x * (x + 1) / 2 : x * x) + token * x;
}

double dcs_split_work(std::int64_t n, int cp, int r, const DocCost& c) {
  const std::int64_t ch = dcs_chunk_len(n, cp);
  double w = 0;
  for (std::int64_t lo : {r * ch, (2 * cp - 1 - r) * ch}) {
    const double a = static_cast<double>(std::min(lo, n)), b = static_cast<double>(std::min(lo + ch, n));
    const double pairs = c.causal ? (b * (b + 1) - a * (a + 1)) / 2 : (b - a) * static_cast<double>(n);
    w += c.pair * pairs + c.token * (b - a);
  }
  return w;
}

namespace {

struct Placed {
  std::vector<int> owner;
  std::vector<double> work;
  double heaviest() const { return *std::max_element(work.begin(), work.end()); }
};

// Split documents over every rank; whole ones heaviest first (ties: the earlier document) on the
// least-loaded rank (ties: the lower rank).
Placed place(const std::vector<std::int64_t>& lens, int cp, const std::vector<bool>& split,
             const std::vector<std::size_t>& by_weight, const DocCost& c) {
  Placed p{std::vector<int>(lens.size(), -1), std::vector<double>(static_cast<std::size_t>(cp), 0.0)};
  for (std::size_t d = 0; d < lens.size(); ++d)
    if (split[d])
      for (int r = 0; r < cp; ++r) p.work[static_cast<std::size_t>(r)] += dcs_split_work(lens[d], cp, r, c);
  for (std::size_t d : by_weight) {
    if (split[d]) continue;
    const auto r = static_cast<std::size_t>(std::min_element(p.work.begin(), p.work.end()) - p.work.begin());
    p.owner[d] = static_cast<int>(r);
    p.work[r] += c.of(lens[d]);
  }
  return p;
}

// A THD layout of the sequences ending at cu[1..] (none: no sequence).
SeqLayout packed(std::vector<std::int64_t> cu) {
  if (cu.size() > 1) return SeqLayout::thd(std::move(cu));
  SeqLayout none;
  none.format = Format::THD;
  none.cu_seqlens = {0};
  return none;
}

}  // namespace

double max_over_mean(const std::vector<double>& v) {
  const double sum = std::accumulate(v.begin(), v.end(), 0.0);
  return sum > 0 ? *std::max_element(v.begin(), v.end()) * static_cast<double>(v.size()) / sum : 1.0;
}

std::vector<std::size_t> heaviest_first(const std::vector<std::int64_t>& lens, int cp, const char* what) {
  HCP_CHECK(cp >= 1, what, ": cp size must be >= 1");
  for (std::size_t d = 0; d < lens.size(); ++d)
    HCP_CHECK(lens[d] >= 1, what, ": document ", d, " has length ", lens[d], " (must be >= 1)");
  std::vector<std::size_t> order(lens.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return lens[a] > lens[b]; });
  return order;
}

DocPartition partition_documents(const std::vector<std::int64_t>& lens, int cp, std::int64_t split_len,
                                 const DocCost& cost) {
  HCP_CHECK(split_len >= 0, "document partition: the split length must be >= 0");
  const std::vector<std::size_t> by_weight = heaviest_first(lens, cp, "document partition");

  std::vector<bool> split(lens.size(), false);
  if (cp > 1 && split_len > 0)
    for (std::size_t d = 0; d < lens.size(); ++d) split[d] = lens[d] >= split_len;
  Placed p = place(lens, cp, split, by_weight, cost);
  if (cp > 1 && split_len == 0) {  // split the k heaviest, for the k that balances best
    std::vector<bool> s = split;
    for (std::size_t k = 0; k < by_weight.size() && max_over_mean(p.work) > 1.1; ++k) {
      s[by_weight[k]] = true;
      Placed q = place(lens, cp, s, by_weight, cost);
      if (q.heaviest() < p.heaviest()) {
        split = s;
        p = std::move(q);
      }
    }
  }

  std::vector<int> group(lens.size(), 1), block(lens.size(), -1);
  for (std::size_t d = 0; d < lens.size(); ++d)
    if (split[d]) {
      group[d] = cp;
      block[d] = 0;
    }
  return make_partition(lens, cp, p.owner, std::move(group), std::move(block), p.work);
}

DocPartition make_partition(const std::vector<std::int64_t>& lens, int cp, std::vector<int> owner,
                            std::vector<int> group, std::vector<int> block, std::vector<double> work) {
  DocPartition out;
  out.cp = cp;
  out.lens = lens;
  out.owner = std::move(owner);
  out.group = std::move(group);
  out.block = std::move(block);
  out.work = std::move(work);
  std::vector<std::vector<std::int64_t>> cu(static_cast<std::size_t>(cp), std::vector<std::int64_t>{0});
  for (std::size_t d = 0; d < lens.size(); ++d) {
    if (out.owner[d] >= 0) {
      auto& w = cu[static_cast<std::size_t>(out.owner[d])];
      w.push_back(w.back() + lens[d]);
    } else {
      out.split_len = out.split_len == 0 ? lens[d] : std::min(out.split_len, lens[d]);
    }
  }
  for (auto& c : cu) out.whole.push_back(packed(std::move(c)));
  return out;
}

std::vector<int> DocPartition::group_sizes() const {
  std::vector<int> out;
  for (std::size_t d = 0; d < lens.size(); ++d)
    if (owner[d] < 0 && std::find(out.begin(), out.end(), group[d]) == out.end()) out.push_back(group[d]);
  std::sort(out.begin(), out.end());
  return out;
}

SplitPart DocPartition::split_part(int g, int b) const {
  std::vector<std::int64_t> cu{0}, real;
  for (std::size_t d = 0; d < lens.size(); ++d)
    if (owner[d] < 0 && group[d] == g && block[d] == b) {
      cu.push_back(cu.back() + dcs_padded_len(lens[d], g));
      real.push_back(lens[d]);
    }
  SplitPart part{g, b, packed(cu)};
  part.layout.real_lens = real;
  return part;
}

std::vector<SplitPart> DocPartition::split_parts(int rank) const {
  HCP_CHECK(rank >= 0 && rank < cp, "document partition: rank ", rank, " outside [0, ", cp, ")");
  std::vector<SplitPart> out;
  for (int g : group_sizes()) out.push_back(split_part(g, rank / g));
  return out;
}

std::int64_t DocPartition::split_rows(int rank) const {
  std::int64_t n = 0;
  for (const SplitPart& s : split_parts(rank)) n += s.local_rows();
  return n;
}

std::int64_t DocPartition::pad_tokens() const {
  std::int64_t n = 0;
  for (std::size_t d = 0; d < lens.size(); ++d)
    if (owner[d] < 0) n += dcs_padded_len(lens[d], group[d]) - lens[d];
  return n;
}

std::int64_t DocPartition::most_rows() const {
  std::int64_t most = 0;
  for (int r = 0; r < cp; ++r) most = std::max(most, local_rows(r));
  return most;
}

std::int64_t DocPartition::documents_split() const {
  return static_cast<std::int64_t>(std::count(owner.begin(), owner.end(), -1));
}

std::vector<std::int64_t> DocPartition::real_index(int rank) const {
  HCP_CHECK(rank >= 0 && rank < cp, "document partition: rank ", rank, " outside [0, ", cp, ")");
  std::vector<std::int64_t> rows, start(lens.size() + 1, 0);
  for (std::size_t d = 0; d < lens.size(); ++d) start[d + 1] = start[d] + lens[d];
  for (std::size_t d = 0; d < lens.size(); ++d)
    if (owner[d] == rank)
      for (std::int64_t i = 0; i < lens[d]; ++i) rows.push_back(start[d] + i);
  for (const SplitPart& s : split_parts(rank)) {
    if (s.layout.nseq() == 0) continue;
    std::vector<std::int64_t> to_global;  // the part's real tokens, as rows of the unpadded problem
    for (std::size_t d = 0; d < lens.size(); ++d)
      if (owner[d] < 0 && group[d] == s.g && block[d] == s.block)
        for (std::int64_t i = 0; i < lens[d]; ++i) to_global.push_back(start[d] + i);
    for (std::int64_t k : local_real_index(s.layout, s.g, s.rank_in_block(rank)))
      rows.push_back(k < 0 ? -1 : to_global[static_cast<std::size_t>(k)]);
  }
  return rows;
}

std::int64_t DocPartition::real_tokens(int rank) const {
  std::int64_t n = whole_rows(rank);
  for (const SplitPart& s : split_parts(rank))
    for (std::int64_t q = 0; q < s.layout.nseq(); ++q) n += local_real(s.layout, q, s.g, s.rank_in_block(rank));
  return n;
}

std::vector<std::int64_t> DocPartition::positions(int rank) const {
  std::vector<std::int64_t> pos;
  const SeqLayout& w = whole[static_cast<std::size_t>(rank)];
  for (std::int64_t s = 0; s < w.nseq(); ++s)
    for (std::int64_t i = 0; i < w.len(s); ++i) pos.push_back(i);
  for (const SplitPart& s : split_parts(rank))
    if (s.layout.nseq() > 0)
      for (std::int64_t p : dcs_positions(s.layout, s.g, s.rank_in_block(rank))) pos.push_back(p);
  return pos;
}

double DocPartition::work_imbalance() const { return max_over_mean(work); }

double DocPartition::token_imbalance() const {
  std::vector<double> t(static_cast<std::size_t>(cp), 0.0);
  for (int r = 0; r < cp; ++r) t[static_cast<std::size_t>(r)] = static_cast<double>(real_tokens(r));
  return max_over_mean(t);
}

std::string DocPartition::split_groups(const std::string& open, const std::string& close) const {
  std::string by_g;
  for (int g : group_sizes()) {
    int n = 0;
    for (std::size_t d = 0; d < lens.size(); ++d) n += owner[d] < 0 && group[d] == g ? 1 : 0;
    by_g += (by_g.empty() ? "" : ", ") + std::to_string(n) + " over " + std::to_string(g) + " ranks";
  }
  return by_g.empty() ? by_g : open + by_g + close;
}

std::string DocPartition::summary() const {
  const std::string by_g = split_groups(" (", "; shortest " + std::to_string(split_len) + " tokens)");
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%zu documents: %lld whole, %lld split%s; %lld pad tokens; work max/mean %.3f, tokens max/mean %.3f",
                lens.size(), static_cast<long long>(static_cast<std::int64_t>(lens.size()) - documents_split()),
                static_cast<long long>(documents_split()), by_g.c_str(), static_cast<long long>(pad_tokens()),
                work_imbalance(), token_imbalance());
  return buf;
}

Tensor gather_documents(Communicator& comm, const Tensor& local, const DocPartition& p) {
  const int cp = comm.size();
  HCP_CHECK(cp == p.cp, "gather_documents: documents placed over ", p.cp, " ranks, gathered over ", cp);
  HCP_CHECK(local.size(0) == p.local_rows(comm.rank()), "gather_documents: ", local.size(0),
            " local rows, placement has ", p.local_rows(comm.rank()));
  const std::int64_t most = p.most_rows();
  std::int64_t total = 0;
  for (std::int64_t n : p.lens) total += n;
  Shape shp = local.shape();
  shp[0] = most;
  Tensor send = Tensor::zeros(shp, local.dtype(), local.space());
  if (local.size(0) > 0) send.slice(0, 0, local.size(0)).copy_from(local);
  shp[0] = most * cp;
  Tensor all = Tensor::empty(shp, local.dtype(), local.space());
  comm.all_gather(send, all);
  shp[0] = total;
  Tensor out = Tensor::zeros(shp, local.dtype(), local.space());
  std::vector<std::int64_t> dst, src;
  for (int r = 0; r < cp; ++r) {
    const std::vector<std::int64_t> idx = p.real_index(r);
    for (std::size_t i = 0; i < idx.size(); ++i)
      if (idx[i] >= 0) {
        dst.push_back(idx[i]);
        src.push_back(r * most + static_cast<std::int64_t>(i));
      }
  }
  if (!dst.empty()) copy_rows(out, all, dst, src);
  return out;
}

}  // namespace hcp::cp
