// The per-document placement (cp/documents.hpp): every real token on exactly one rank, whole
// documents unpadded, the split rule, balance, and the edge cases (length 1, more ranks than
// documents, cp = 1).
#include <gtest/gtest.h>

#include <numeric>

#include "core/error.hpp"
#include "cp/documents.hpp"
#include "cp/layout.hpp"
#include "unit/doc_checks.hpp"

using namespace hcp;
using cp::DocCost;
using cp::DocPartition;
using cp::partition_documents;
using test::expect_permutation;

TEST(Documents, OneRankIsTheUnpaddedProblem) {
  const DocPartition p = partition_documents({7, 1, 30}, 1, 0, DocCost{});
  EXPECT_EQ(p.documents_split(), 0);
  EXPECT_EQ(p.pad_tokens(), 0);
  std::vector<std::int64_t> id(38);
  std::iota(id.begin(), id.end(), 0);
  EXPECT_EQ(p.real_index(0), id);
}

TEST(Documents, ShortDocumentsStayWholeAndUnpadded) {
  // one long document and many short ones: the long one is split, the short ones balance the rest
  std::vector<std::int64_t> lens{2000};
  for (int i = 0; i < 40; ++i) lens.push_back(37 + 11 * i);
  const DocPartition p = partition_documents(lens, 4, 0, DocCost{});
  expect_permutation(p);
  EXPECT_EQ(p.owner[0], -1);
  EXPECT_EQ(p.documents_split(), 1);
  EXPECT_EQ(p.pad_tokens(), cp::dcs_padded_len(2000, 4) - 2000);
  EXPECT_LE(p.work_imbalance(), 1.1);
  // the work per rank is what the cost model gives the rank's documents and chunks
  double total = 0;
  for (std::int64_t n : lens) total += DocCost{}.of(n);
  EXPECT_NEAR(std::accumulate(p.work.begin(), p.work.end(), 0.0), total, 1e-9 * total);
}

TEST(Documents, EveryDocumentWholeWhenTheyBalance) {
  const DocPartition p = partition_documents({100, 100, 100, 100, 100, 100, 100, 100}, 4, 0, DocCost{});
  expect_permutation(p);
  EXPECT_EQ(p.documents_split(), 0);
  EXPECT_EQ(p.pad_tokens(), 0);
  EXPECT_DOUBLE_EQ(p.work_imbalance(), 1.0);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(p.local_rows(r), 200);
}

TEST(Documents, SplitLengthRule) {
  const DocPartition p = partition_documents({5, 64, 63, 200, 1}, 2, 63, DocCost{});
  expect_permutation(p);
  EXPECT_EQ(p.owner[1], -1);
  EXPECT_EQ(p.owner[2], -1);
  EXPECT_EQ(p.owner[3], -1);
  EXPECT_GE(p.owner[0], 0);
  EXPECT_GE(p.owner[4], 0);
  EXPECT_EQ(p.split_len, 63);
  EXPECT_EQ(p.split_part(2, 0).layout.nseq(), 3);
  EXPECT_EQ(p.pad_tokens(), (64 - 64) + (64 - 63) + (200 - 200));
}

TEST(Documents, MoreRanksThanDocuments) {
  const DocPartition whole = partition_documents({5, 3}, 8, 1000, DocCost{});
  expect_permutation(whole);
  int empty = 0;
  for (int r = 0; r < 8; ++r) empty += whole.local_rows(r) == 0;
  EXPECT_EQ(empty, 6);
  const DocPartition split = partition_documents({1, 2}, 8, 1, DocCost{});  // split even a 1-token document
  expect_permutation(split);
  EXPECT_EQ(split.pad_tokens(), 16 + 16 - 3);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(split.local_rows(r), 4);
}

TEST(Documents, HeaviestFirstOnTheLeastLoadedRank) {
  // non-causal work n^2: 9, 4, 4, 1 on two ranks -> {9}, {4, 4, 1}
  const DocPartition p = partition_documents({3, 2, 2, 1}, 2, 1000, DocCost{1.0, 0.0, false});
  EXPECT_EQ(p.owner, (std::vector<int>{0, 1, 1, 1}));
  EXPECT_EQ(p.work, (std::vector<double>{9, 9}));
}

TEST(Documents, DeterministicAndRefusesEmptyDocuments) {
  const std::vector<std::int64_t> lens{300, 17, 17, 900, 1, 45};
  const DocPartition a = partition_documents(lens, 3, 0, DocCost{}), b = partition_documents(lens, 3, 0, DocCost{});
  EXPECT_EQ(a.owner, b.owner);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(a.real_index(r), b.real_index(r));
  EXPECT_THROW(partition_documents({4, 0, 2}, 2, 0, DocCost{}), Error);
}
