// Checks shared by the per-document placements' tests (cp/documents.hpp, cp/doc_groups.hpp).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "cp/documents.hpp"

namespace hcp::test {

// Every real token of the unpadded problem is on exactly one rank, in order inside each rank's
// whole documents, and every rank's row count matches its local_rows.
inline void expect_permutation(const cp::DocPartition& p) {
  const std::int64_t T = std::accumulate(p.lens.begin(), p.lens.end(), std::int64_t{0});
  std::vector<int> seen(static_cast<std::size_t>(T), 0);
  for (int r = 0; r < p.cp; ++r) {
    const std::vector<std::int64_t> idx = p.real_index(r);
    ASSERT_EQ(static_cast<std::int64_t>(idx.size()), p.local_rows(r)) << "rank " << r;
    for (std::int64_t i : idx)
      if (i >= 0) ++seen[static_cast<std::size_t>(i)];
    for (std::int64_t i = 1; i < p.whole_rows(r); ++i) {
      const auto a = idx[static_cast<std::size_t>(i - 1)], b = idx[static_cast<std::size_t>(i)];
      EXPECT_TRUE(b == a + 1 || p.whole[static_cast<std::size_t>(r)].cu_seqlens.end() !=
                                    std::find(p.whole[static_cast<std::size_t>(r)].cu_seqlens.begin(),
                                              p.whole[static_cast<std::size_t>(r)].cu_seqlens.end(), i))
          << "rank " << r << " row " << i;
    }
  }
  for (std::int64_t t = 0; t < T; ++t) EXPECT_EQ(seen[static_cast<std::size_t>(t)], 1) << "token " << t;
}

}  // namespace hcp::test
