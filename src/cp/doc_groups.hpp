// Per-document placement with sub-groups: each split document over the smallest group of ranks that
// balances the work, not over the whole CP group.
//
// The per-document placement (cp/documents.hpp) keeps short documents whole on one rank and splits
// the heaviest ones over every rank of the CP group, so a split document's K/V still travels the
// whole ring. Here a split document goes to an aligned block of g ranks, [b g, (b + 1) g), where g
// divides the CP size (a power of two, or any divisor), and is split by DualChunkSwap over that
// block alone; several blocks run their own documents at once. The sizes are chosen with the whole
// documents so that the heaviest rank's work is within 1.1 x the mean, preferring the smallest g
// (the fewest bytes: a document's K/V goes around g ranks). A pure function of the lengths, the CP
// size, the group rule and the cost model: every rank computes the same placement without talking.
//
// The result is a DocPartition (cp/documents.hpp): a rank's rows are its whole documents in global
// order, then for each group size in use (ascending) its DualChunkSwap chunks of the documents split
// over its block of that size (DocPartition::split_parts).
#pragma once
#include <cstdint>
#include <vector>

#include "core/seq_layout.hpp"
#include "cp/documents.hpp"

namespace hcp::cp {

// Which group sizes a split document may use: powers of two dividing the CP size, or any divisor;
// the whole CP group is always allowed (a CP size with no power-of-two divisor still splits).
enum class GroupSizes { PowersOfTwo, Divisors };

// The placement of documents of real lengths `lens` (each >= 1) over `cp` ranks, work by `cost`.
// The k heaviest documents are split, all over groups of one size g, for the smallest k and then the
// smallest allowed g that bring the heaviest rank's work within 1.1 x the mean (k = 0: every
// document whole); when none does, for the (k, g) that leaves the heaviest rank the least work.
// Then each split document, heaviest first, moves to the smallest g that keeps the placement
// balanced (or the heaviest rank's work no larger). Split documents are placed heaviest first on
// the block whose heaviest rank is least loaded, then whole documents heaviest first on the
// least-loaded rank (ties: the lower block or rank). At cp = 1 every document is whole.
DocPartition place_document_groups(const std::vector<std::int64_t>& lens, int cp, const DocCost& cost,
                                   GroupSizes sizes);

}  // namespace hcp::cp
