// The per-document placement with sub-groups (cp/doc_groups.hpp): every real token on exactly one
// rank, a split document over an aligned block whose size divides cp, the smallest size that
// balances, and the edge cases (one document heavier than all others together, more ranks than
// documents, every document whole, cp = 1).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "core/error.hpp"
#include "cp/doc_groups.hpp"
#include "cp/layout.hpp"
#include "unit/doc_checks.hpp"

using namespace hcp;
using cp::DocCost;
using cp::DocPartition;
using cp::GroupSizes;
using cp::place_document_groups;

namespace {
const DocCost kTokens{0.0, 1.0, true};  // work linear in the tokens

// Every real token of the unpadded problem is on exactly one rank (in order inside its whole
// documents); each rank's rows are local_rows; a split document lies on a block of a size that
// divides cp, a whole one on a rank.
void expect_placement(const DocPartition& p, GroupSizes sizes) {
  test::expect_permutation(p);
  for (std::size_t d = 0; d < p.lens.size(); ++d) {
    if (p.owner[d] >= 0) {
      EXPECT_EQ(p.group[d], 1) << "document " << d;
      EXPECT_LT(p.owner[d], p.cp) << "document " << d;
      continue;
    }
    const int g = p.group[d];
    EXPECT_TRUE(g >= 2 && p.cp % g == 0) << "document " << d << " over " << g << " of " << p.cp << " ranks";
    if (sizes == GroupSizes::PowersOfTwo) {
      EXPECT_TRUE((g & (g - 1)) == 0 || g == p.cp) << "document " << d << " over " << g;
    }
    EXPECT_TRUE(p.block[d] >= 0 && p.block[d] < p.cp / g) << "document " << d;
  }
}

// The work per rank recomputed from the placement.
std::vector<double> work_of(const DocPartition& p, const DocCost& c) {
  std::vector<double> w(static_cast<std::size_t>(p.cp), 0.0);
  for (std::size_t d = 0; d < p.lens.size(); ++d) {
    if (p.owner[d] >= 0) {
      w[static_cast<std::size_t>(p.owner[d])] += c.of(p.lens[d]);
      continue;
    }
    for (int i = 0; i < p.group[d]; ++i)
      w[static_cast<std::size_t>(p.block[d] * p.group[d] + i)] += cp::dcs_split_work(p.lens[d], p.group[d], i, c);
  }
  return w;
}
}  // namespace

TEST(DocGroups, OneRankIsTheUnpaddedProblem) {
  const DocPartition p = place_document_groups({7, 1, 30}, 1, DocCost{}, GroupSizes::PowersOfTwo);
  EXPECT_EQ(p.documents_split(), 0);
  EXPECT_EQ(p.pad_tokens(), 0);
  std::vector<std::int64_t> id(38);
  std::iota(id.begin(), id.end(), 0);
  EXPECT_EQ(p.real_index(0), id);
  EXPECT_EQ(p.local_rows(0), 38);
}

TEST(DocGroups, EveryDocumentWholeWhenTheyBalance) {
  const DocPartition p = place_document_groups({100, 100, 100, 100, 3}, 4, DocCost{}, GroupSizes::PowersOfTwo);
  expect_placement(p, GroupSizes::PowersOfTwo);
  EXPECT_EQ(p.documents_split(), 0);
  EXPECT_EQ(p.pad_tokens(), 0);
  EXPECT_LE(p.work_imbalance(), 1.1);
}

TEST(DocGroups, TheSmallestGroupThatBalances) {
  // 400 tokens on 4 ranks: the 200-token document over 2 ranks and the others whole balance
  // exactly; over all 4 ranks they would not be needed
  const DocPartition p = place_document_groups({100, 200, 100}, 4, kTokens, GroupSizes::PowersOfTwo);
  expect_placement(p, GroupSizes::PowersOfTwo);
  EXPECT_EQ(p.owner[1], -1);
  EXPECT_EQ(p.group[1], 2);
  EXPECT_GE(p.owner[0], 0);
  EXPECT_GE(p.owner[2], 0);
  EXPECT_DOUBLE_EQ(p.work_imbalance(), 1.0);
  EXPECT_EQ(work_of(p, kTokens), p.work);
  // the two whole documents fill the other block's ranks
  const int other = 1 - p.block[1];
  EXPECT_EQ(p.owner[0] / 2, other);
  EXPECT_EQ(p.owner[2] / 2, other);
}

TEST(DocGroups, TheWholeGroupWhenOnlyItBalances) {
  const DocPartition p = place_document_groups({400, 10}, 4, kTokens, GroupSizes::PowersOfTwo);
  expect_placement(p, GroupSizes::PowersOfTwo);
  EXPECT_EQ(p.group[0], 4);
  EXPECT_LE(p.work_imbalance(), 1.1);
  EXPECT_EQ(work_of(p, kTokens), p.work);
}

TEST(DocGroups, OneDocumentHeavierThanAllOthersTogether) {
  std::vector<std::int64_t> lens{16384};
  for (int i = 0; i < 24; ++i) lens.push_back(100 + 37 * i);
  const DocPartition p = place_document_groups(lens, 8, DocCost{}, GroupSizes::PowersOfTwo);
  expect_placement(p, GroupSizes::PowersOfTwo);
  EXPECT_EQ(p.owner[0], -1);
  EXPECT_LE(p.work_imbalance(), 1.1);
  EXPECT_EQ(work_of(p, DocCost{}), p.work);
  EXPECT_EQ(p.pad_tokens(), cp::dcs_padded_len(16384, p.group[0]) - 16384);
}

TEST(DocGroups, MoreRanksThanDocuments) {
  const std::vector<std::int64_t> lens{50, 60, 70};
  const DocPartition p = place_document_groups(lens, 8, kTokens, GroupSizes::PowersOfTwo);
  expect_placement(p, GroupSizes::PowersOfTwo);
  const DocPartition whole = place_document_groups(lens, 1, kTokens, GroupSizes::PowersOfTwo);
  EXPECT_GT(p.documents_split(), 0);  // three documents on eight ranks cannot balance whole
  EXPECT_LT(*std::max_element(p.work.begin(), p.work.end()), 70.0);
  EXPECT_EQ(whole.documents_split(), 0);
}

TEST(DocGroups, AnyDivisorOfTheGroup) {
  // two equal documents on 6 ranks: a block of 3 each balances exactly; powers of two dividing 6
  // allow only 2, which does not balance, so both go over the whole group (always allowed)
  const DocPartition any = place_document_groups({300, 300}, 6, kTokens, GroupSizes::Divisors);
  expect_placement(any, GroupSizes::Divisors);
  EXPECT_EQ(any.group, (std::vector<int>{3, 3}));
  EXPECT_NE(any.block[0], any.block[1]);
  EXPECT_DOUBLE_EQ(any.work_imbalance(), 1.0);
  const DocPartition pow2 = place_document_groups({300, 300}, 6, kTokens, GroupSizes::PowersOfTwo);
  expect_placement(pow2, GroupSizes::PowersOfTwo);
  EXPECT_EQ(pow2.group, (std::vector<int>{6, 6}));
  EXPECT_DOUBLE_EQ(pow2.work_imbalance(), 1.0);
  // a CP size with no power-of-two divisor but 1 still splits, over the whole group
  const DocPartition three = place_document_groups({300, 10}, 3, kTokens, GroupSizes::PowersOfTwo);
  expect_placement(three, GroupSizes::PowersOfTwo);
  EXPECT_EQ(three.group[0], 3);
}

TEST(DocGroups, SplitLayoutsHoldTheirBlocksDocuments) {
  std::vector<std::int64_t> lens{3000, 2900, 40, 50, 60, 70, 80, 90};
  const DocPartition p = place_document_groups(lens, 8, DocCost{}, GroupSizes::PowersOfTwo);
  expect_placement(p, GroupSizes::PowersOfTwo);
  std::int64_t split_real = 0, layouts_real = 0;
  for (std::size_t d = 0; d < lens.size(); ++d) split_real += p.owner[d] < 0 ? lens[d] : 0;
  for (int g : p.group_sizes())
    for (int b = 0; b < 8 / g; ++b) {
      const SeqLayout l = p.split_part(g, b).layout;
      for (std::int64_t s = 0; s < l.nseq(); ++s) {
        EXPECT_EQ(l.len(s) % (2 * g), 0);
        layouts_real += l.real(s);
      }
    }
  EXPECT_EQ(layouts_real, split_real);
  EXPECT_NE(p.summary().find("split"), std::string::npos);
}

TEST(DocGroups, DeterministicAndRefusesEmptyDocuments) {
  const std::vector<std::int64_t> lens{900, 30, 400, 400, 12, 77};
  const DocPartition a = place_document_groups(lens, 4, DocCost{}, GroupSizes::PowersOfTwo),
                     b = place_document_groups(lens, 4, DocCost{}, GroupSizes::PowersOfTwo);
  EXPECT_EQ(a.owner, b.owner);
  EXPECT_EQ(a.group, b.group);
  EXPECT_EQ(a.block, b.block);
  EXPECT_EQ(a.work, b.work);
  EXPECT_THROW(place_document_groups({5, 0}, 2, DocCost{}, GroupSizes::PowersOfTwo), Error);
}
