#include "cp/doc_groups.hpp"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "core/error.hpp"
#include "cp/layout.hpp"

namespace hcp::cp {
namespace {

// A THD layout of the sequences ending at cu[1..] (none: no sequence).
SeqLayout packed(std::vector<std::int64_t> cu) {
  if (cu.size() > 1) return SeqLayout::thd(std::move(cu));
  SeqLayout none;
  none.format = Format::THD;
  none.cu_seqlens = {0};
  return none;
}

constexpr double kBalanced = 1.1;  // the heaviest rank's work over the mean that counts as balanced

struct Placed {
  std::vector<int> owner, block;
  std::vector<double> work;
  double heaviest() const { return *std::max_element(work.begin(), work.end()); }
  double imbalance() const {
    const double sum = std::accumulate(work.begin(), work.end(), 0.0);
    return sum > 0 ? heaviest() * static_cast<double>(work.size()) / sum : 1.0;
  }
};

// Split documents (g_of[d] > 0) heaviest first on the block of g_of[d] ranks whose heaviest rank is
// least loaded; then whole ones heaviest first on the least-loaded rank (ties: the lower one).
Placed place(const std::vector<std::int64_t>& lens, int cp, const std::vector<int>& g_of,
             const std::vector<std::size_t>& by_weight, const DocCost& c) {
  Placed p{std::vector<int>(lens.size(), -1), std::vector<int>(lens.size(), -1),
           std::vector<double>(static_cast<std::size_t>(cp), 0.0)};
  const auto at = [&](int r) -> double& { return p.work[static_cast<std::size_t>(r)]; };
  for (std::size_t d : by_weight) {
    const int g = g_of[d];
    if (g == 0) continue;
    int best = 0;
    double least = 0;
    for (int b = 0; b < cp / g; ++b) {
      double most = 0;
      for (int r = b * g; r < (b + 1) * g; ++r) most = std::max(most, at(r));
      if (b == 0 || most < least) {
        best = b;
        least = most;
      }
    }
    p.block[d] = best;
    for (int i = 0; i < g; ++i) at(best * g + i) += dcs_split_work(lens[d], g, i, c);
  }
  for (std::size_t d : by_weight) {
    if (g_of[d] != 0) continue;
    const auto r = static_cast<int>(std::min_element(p.work.begin(), p.work.end()) - p.work.begin());
    p.owner[d] = r;
    at(r) += c.of(lens[d]);
  }
  return p;
}

std::vector<int> allowed_sizes(int cp, GroupSizes sizes) {
  std::vector<int> out;
  for (int g = 2; g <= cp; ++g)
    if (cp % g == 0 && (sizes == GroupSizes::Divisors || (g & (g - 1)) == 0)) out.push_back(g);
  return out;
}

}  // namespace

DocGroups place_document_groups(const std::vector<std::int64_t>& lens, int cp, const DocCost& cost, GroupSizes sizes) {
  const std::vector<std::size_t> by_weight = heaviest_first(lens, cp, "document groups");

  const std::vector<int> allowed = allowed_sizes(cp, sizes);
  // The k heaviest documents split, all over groups of g: the smallest k, then the smallest g, that
  // balances; else the (k, g) leaving the heaviest rank the least work (ties: smaller k, then g).
  std::vector<int> g_of(lens.size(), 0);
  Placed p = place(lens, cp, g_of, by_weight, cost);
  bool balanced = p.imbalance() <= kBalanced;
  for (std::size_t k = 1; k <= by_weight.size() && !balanced; ++k)
    for (int g : allowed) {
      std::vector<int> trial(lens.size(), 0);
      for (std::size_t i = 0; i < k; ++i) trial[by_weight[i]] = g;
      Placed q = place(lens, cp, trial, by_weight, cost);
      balanced = q.imbalance() <= kBalanced;
      if (balanced || q.heaviest() < p.heaviest()) {
        g_of = trial;
        p = std::move(q);
      }
      if (balanced) break;
    }
  // Then each split document, heaviest first, over the smallest group that keeps the placement
  // balanced (or, when none balances, leaves the heaviest rank no more work): fewer bytes.
  for (std::size_t d : by_weight) {
    if (g_of[d] == 0) continue;
    for (int g : allowed) {
      if (g >= g_of[d]) break;
      std::vector<int> trial = g_of;
      trial[d] = g;
      Placed q = place(lens, cp, trial, by_weight, cost);
      if (balanced ? q.imbalance() <= kBalanced : q.heaviest() <= p.heaviest()) {
        g_of = trial;
        p = std::move(q);
        break;
      }
    }
  }

  DocGroups out;
  out.cp = cp;
  out.lens = lens;
  out.owner = p.owner;
  out.block = p.block;
  out.work = p.work;
  out.group.resize(lens.size());
  for (std::size_t d = 0; d < lens.size(); ++d) out.group[d] = g_of[d] == 0 ? 1 : g_of[d];
  return out;
}

std::vector<int> DocGroups::group_sizes() const {
  std::vector<int> out;
  for (std::size_t d = 0; d < lens.size(); ++d)
    if (owner[d] < 0 && std::find(out.begin(), out.end(), group[d]) == out.end()) out.push_back(group[d]);
  std::sort(out.begin(), out.end());
  return out;
}

SeqLayout DocGroups::split_layout(int g, int b) const {
  std::vector<std::int64_t> cu{0}, real;
  for (std::size_t d = 0; d < lens.size(); ++d)
    if (owner[d] < 0 && group[d] == g && block[d] == b) {
      cu.push_back(cu.back() + dcs_padded_len(lens[d], g));
      real.push_back(lens[d]);
    }
  SeqLayout l = packed(cu);
  l.real_lens = real;
  return l;
}

SeqLayout DocGroups::whole_layout(int rank) const {
  std::vector<std::int64_t> cu{0};
  for (std::size_t d = 0; d < lens.size(); ++d)
    if (owner[d] == rank) cu.push_back(cu.back() + lens[d]);
  return packed(cu);
}

std::int64_t DocGroups::local_rows(int rank) const {
  std::int64_t n = whole_layout(rank).total();
  for (int g : group_sizes()) n += split_layout(g, rank / g).total() / g;
  return n;
}

std::vector<std::int64_t> DocGroups::real_index(int rank) const {
  HCP_CHECK(rank >= 0 && rank < cp, "document groups: rank ", rank, " outside [0, ", cp, ")");
  std::vector<std::int64_t> rows, start(lens.size() + 1, 0);
  for (std::size_t d = 0; d < lens.size(); ++d) start[d + 1] = start[d] + lens[d];
  for (std::size_t d = 0; d < lens.size(); ++d)
    if (owner[d] == rank)
      for (std::int64_t i = 0; i < lens[d]; ++i) rows.push_back(start[d] + i);
  for (int g : group_sizes()) {
    const int b = rank / g;
    std::vector<std::int64_t> to_global;  // rows of split_layout(g, b)'s real tokens
    for (std::size_t d = 0; d < lens.size(); ++d)
      if (owner[d] < 0 && group[d] == g && block[d] == b)
        for (std::int64_t i = 0; i < lens[d]; ++i) to_global.push_back(start[d] + i);
    const SeqLayout l = split_layout(g, b);
    if (l.nseq() == 0) continue;
    for (std::int64_t k : local_real_index(l, g, rank % g))
      rows.push_back(k < 0 ? -1 : to_global[static_cast<std::size_t>(k)]);
  }
  return rows;
}

std::int64_t DocGroups::pad_tokens() const {
  std::int64_t n = 0;
  for (std::size_t d = 0; d < lens.size(); ++d)
    if (owner[d] < 0) n += dcs_padded_len(lens[d], group[d]) - lens[d];
  return n;
}

std::int64_t DocGroups::documents_split() const {
  return static_cast<std::int64_t>(std::count(owner.begin(), owner.end(), -1));
}

double DocGroups::work_imbalance() const {
  const double sum = std::accumulate(work.begin(), work.end(), 0.0);
  return sum > 0 ? *std::max_element(work.begin(), work.end()) * static_cast<double>(work.size()) / sum : 1.0;
}

std::string DocGroups::summary() const {
  std::string by_g;
  for (int g : group_sizes()) {
    const auto n = std::count_if(group.begin(), group.end(), [&](int x) { return x == g; });
    by_g += (by_g.empty() ? "" : ", ") + std::to_string(n) + " over " + std::to_string(g) + " ranks";
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "%zu documents: %lld whole, %lld split (%s); %lld pad tokens; work max/mean %.3f",
                lens.size(), static_cast<long long>(static_cast<std::int64_t>(lens.size()) - documents_split()),
                static_cast<long long>(documents_split()), by_g.empty() ? "none" : by_g.c_str(),
                static_cast<long long>(pad_tokens()), work_imbalance());
  return buf;
}

}  // namespace hcp::cp
