#include "cp/doc_groups.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "cp/layout.hpp"

namespace hcp::cp {
namespace {

constexpr double kBalanced = 1.1;  // the heaviest rank's work over the mean that counts as balanced

struct Placed {
  std::vector<int> owner, block;
  std::vector<double> work;
  double heaviest() const { return *std::max_element(work.begin(), work.end()); }
  double imbalance() const { return max_over_mean(work); }
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
    if (cp % g == 0 && (sizes == GroupSizes::Divisors || (g & (g - 1)) == 0 || g == cp)) out.push_back(g);
  return out;
}

}  // namespace

DocPartition place_document_groups(const std::vector<std::int64_t>& lens, int cp, const DocCost& cost,
                                   GroupSizes sizes) {
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

  std::vector<int> group(lens.size(), 1);
  for (std::size_t d = 0; d < lens.size(); ++d)
    if (g_of[d] != 0) group[d] = g_of[d];
  return make_partition(lens, cp, p.owner, std::move(group), p.block, p.work);
}

}  // namespace hcp::cp
