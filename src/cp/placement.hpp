// A batch's placement over the `cp` ranks of a CP group: the one value that the DualChunkSwap
// placement (chunks r and 2cp-1-r of every padded sequence on rank r) and the per-document one
// (whole documents on one rank, the heavy ones split over the group: cp/documents.hpp) both
// produce. It answers what the layers, the drivers and the study ask of a placement: each rank's
// rows as rows of the batch and of the unpadded problem, their positions, the part that runs as a
// CP problem over the group, and every rank's rows gathered back into the unpadded order.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/seq_layout.hpp"
#include "cp/documents.hpp"

namespace hcp {
class Communicator;
class Tensor;
}  // namespace hcp

namespace hcp::cp {

struct CpPart;

struct Placement {
  int cp = 1;
  // The batch's layout: DualChunkSwap, the padded layout the ranks' chunks come from; per document,
  // the layout the caller built the batch on (its real rows are the unpadded problem's).
  SeqLayout global;
  std::shared_ptr<const DocPartition> docs;  // per document; null: DualChunkSwap of `global`

  static Placement dcs(SeqLayout global, int cp);
  static Placement documents(SeqLayout global, std::shared_ptr<const DocPartition> docs);
  bool by_documents() const { return docs != nullptr; }
  // The rows of rank `rank` that run as CP problems, each over the block of ranks it is split on:
  // DualChunkSwap, all of them over the whole group; per document, one part per group size its
  // split documents use (ascending; none when every document is whole), each possibly empty on
  // this rank's block (every rank gets the same number of parts, in the same order).
  std::vector<CpPart> cp_parts(int rank) const;
  // Every block's CP problem once (as its first rank sees it; rows not set): the DualChunkSwap
  // layout over the group, or per group size in use each block's split documents (possibly none).
  std::vector<CpPart> all_parts() const;

  // Rows rank `rank` holds (pads included).
  std::int64_t local_rows(int rank) const;
  // For each of them, its row in `global` (DualChunkSwap) or in the unpadded problem (per document,
  // -1: a pad): where its token id and label come from.
  std::vector<std::int64_t> batch_index(int rank) const;
  // For each of them, its row in the unpadded problem (the real tokens in global order), -1: a pad.
  std::vector<std::int64_t> real_index(int rank) const;
  // For each of them, its position inside its own sequence (RoPE reads them; pads continue theirs).
  std::vector<std::int64_t> positions(int rank) const;
  // Every rank's local [rows, ...] gathered into the unpadded problem's order, pads dropped, on
  // every rank of `comm` (the CP group). Collective.
  Tensor gather_real(Communicator& comm, const Tensor& local) const;
  // The values of a per-row list of the batch (token ids, labels) that rank `rank` holds; `pad` for
  // a pad row.
  std::vector<std::int64_t> take(const std::vector<std::int64_t>& batch_values, int rank, std::int64_t pad) const;
};

// One CP problem of a placement on one rank: the DualChunkSwap placement of its rows over the
// `placement.cp` ranks of block `block` ([block * g, (block + 1) * g) of the group), this rank being
// `rank` inside it; rows [offset, offset + rows) of this rank's local rows.
struct CpPart {
  Placement placement;
  int block = 0, rank = 0;
  std::int64_t offset = 0, rows = 0;
  bool empty() const { return placement.global.nseq() == 0; }  // no document of this size on the block
  bool whole_group(int cp) const { return placement.cp == cp; }
};

}  // namespace hcp::cp
