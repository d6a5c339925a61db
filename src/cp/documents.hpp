// Per-document placement of packed (THD) sequences over a CP group (data.partition = documents).
//
// The DualChunkSwap layout (cp/layout.hpp) pads every sequence to a multiple of 2*cp and gives every
// rank two chunks of each, so a short document is spread over all ranks and its K/V travels around
// the whole ring. Here a document either goes whole to one rank — no padding, no communication —
// or, when keeping it whole would leave the ranks' work out of balance, is split by DualChunkSwap
// over the CP group (padded to 2*cp as its own split needs). Whole documents are placed
// heaviest-first on the least-loaded rank. The placement is a pure function of the lengths, the CP
// size, the split rule and the cost model, so every rank computes the same one without talking.
//
// A rank's rows: its whole documents in global order, then its DualChunkSwap chunks of the split
// documents (cp/layout.hpp), so the split part is one contiguous block that any attention CP
// strategy runs over unchanged. Split documents may also go to sub-groups of the CP group
// (cp/doc_groups.hpp); a rank's split rows then follow block by block, smallest group first.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/seq_layout.hpp"
#include "core/tensor.hpp"

namespace hcp::cp {

// Work of a document of n tokens, in arbitrary units: `pair` per (query, key) pair attention visits
// (causal: n(n+1)/2 pairs, else n^2) and `token` per token (the per-token work of the other layers:
// projections, Mamba, MoE, MLP).
struct DocCost {
  double pair = 1, token = 0;
  bool causal = true;
  double of(std::int64_t n) const;
};

// Work of rank r's two DualChunkSwap chunks (over `cp` ranks) of a split document of n real tokens:
// the (query, key) pairs of its real queries (causal: a query at position p sees p + 1 keys) and
// its real tokens.
double dcs_split_work(std::int64_t n, int cp, int r, const DocCost& c);

// The documents' indices, longest first (ties: the earlier document), after checking that each of
// `lens` is >= 1 and cp >= 1 (errors open with `what`).
std::vector<std::size_t> heaviest_first(const std::vector<std::int64_t>& lens, int cp, const char* what);

// The documents split over one block of g ranks, [block g, (block + 1) g), by DualChunkSwap over that
// block alone; `layout` holds them in global order, each padded to 2g (THD; no sequence: none).
struct SplitPart {
  int g = 1, block = 0;
  SeqLayout layout;
  int rank_in_block(int rank) const { return rank - block * g; }
  std::int64_t local_rows() const { return layout.total() / g; }  // on each rank of the block
};

struct DocPartition {
  int cp = 1;
  std::vector<std::int64_t> lens;  // real lengths of the documents, global order
  std::vector<int> owner;          // the rank that holds a whole document; -1: split over a block
  std::vector<int> group;          // a split document's group size g (cp: the whole group); 1 if whole
  std::vector<int> block;          // a split document's block (ranks [block g, (block + 1) g)); -1 if whole
  std::vector<SeqLayout> whole;    // per rank: its whole documents packed, unpadded (THD)
  std::vector<double> work;        // per rank, by the cost model (split documents: the rank's chunks)
  std::int64_t split_len = 0;      // the shortest split document (0: none)

  // The group sizes split documents use, ascending.
  std::vector<int> group_sizes() const;
  // The documents split over block b of size g.
  SplitPart split_part(int g, int b) const;
  // The blocks `rank` is in, one per group size in use (ascending), each with the documents split
  // over it (possibly none): the rank's split rows are their local rows in this order.
  std::vector<SplitPart> split_parts(int rank) const;
  std::int64_t split_rows(int rank) const;  // rows of the split part on `rank`
  std::int64_t whole_rows(int rank) const { return whole[static_cast<std::size_t>(rank)].total(); }
  std::int64_t local_rows(int rank) const { return whole_rows(rank) + split_rows(rank); }
  std::int64_t most_rows() const;  // the largest local_rows over the ranks
  std::int64_t pad_tokens() const;
  std::int64_t real_tokens(int rank) const;  // rows of `rank` that are not pads
  std::int64_t documents_split() const;
  // For each local row of `rank`, its row in the unpadded problem (the documents packed in order at
  // their real lengths), or -1 for a pad.
  std::vector<std::int64_t> real_index(int rank) const;
  // Position of each local row of `rank` inside its own document (RoPE reads them; pads continue
  // their document's positions, as in the DualChunkSwap layout).
  std::vector<std::int64_t> positions(int rank) const;
  // max / mean over ranks of the work, and of the real tokens.
  double work_imbalance() const;
  double token_imbalance() const;
  // The split documents by group size, "n over g ranks, ...", between `open` and `close` ("": none split).
  std::string split_groups(const std::string& open, const std::string& close) const;
  // One line for logs and /config: documents whole and split (by group size), padding, imbalance.
  std::string summary() const;
};

// The partition record of a placement rule's choice: the documents with owner[d] >= 0 whole on
// that rank, the others over group[d] ranks of block[d]; `work` per rank as computed.
DocPartition make_partition(const std::vector<std::int64_t>& lens, int cp, std::vector<int> owner,
                            std::vector<int> group, std::vector<int> block, std::vector<double> work);

// max / mean of `v` (1 when it sums to 0).
double max_over_mean(const std::vector<double>& v);

// The placement of documents of real lengths `lens` (each >= 1) over `cp` ranks. split_len > 0:
// documents of at least split_len tokens are split, the rest stay whole. split_len = 0: chosen —
// the k heaviest documents are split for the smallest k that brings the heaviest rank's work within
// 1.1 x the mean (k = 0: every document whole), or else for the k that leaves the heaviest rank the
// least work (splitting one of several documents of about the same length helps none alone).
// At cp = 1 every document is whole on rank 0 (the unpadded problem).
DocPartition partition_documents(const std::vector<std::int64_t>& lens, int cp, std::int64_t split_len,
                                 const DocCost& cost);

// Every rank's local [rows, ...] tensor of the placement `p`, gathered into the unpadded problem's
// order ([real tokens, ...], pads dropped) on every rank of `comm` (the CP group of `p`).
Tensor gather_documents(Communicator& comm, const Tensor& local, const DocPartition& p);

}  // namespace hcp::cp
