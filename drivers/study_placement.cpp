// Study's part for packed documents placed by document (data.partition = documents or groups): each rank's
// rows, the check through the placement's row map, and the placement in the results; and the
// union of names over ranks that keeps the per-rank writes collective when ranks ran different
// phases.
#include <cstdio>
#include <set>

#include "common.hpp"
#include "study.hpp"

namespace hcp::drivers {

namespace {
// /partition/*: see Study::record_placement.
void write_doc_partition(ResultsWriter& w, const cp::DocPartition& p) {
  std::vector<std::int64_t> lens(p.lens.begin(), p.lens.end()), owner(p.owner.begin(), p.owner.end()),
      group(p.group.begin(), p.group.end()), block(p.block.begin(), p.block.end()), rows, tokens;
  for (int r = 0; r < p.cp; ++r) {
    rows.push_back(p.local_rows(r));
    tokens.push_back(p.real_tokens(r));
  }
  w.counts("/partition/lengths", lens, "[documents] real length", "tokens");
  w.counts("/partition/owner", owner, "[documents] rank holding the document whole, -1 split over a block of ranks",
           "rank");
  w.counts("/partition/group", group, "[documents] ranks a split document runs over (1: whole)", "ranks");
  w.counts("/partition/block", block, "[documents] a split document's block: ranks [block g, (block + 1) g), -1 whole",
           "block");
  w.counts("/partition/rows", rows, "[cp] local rows of each rank, pads included", "tokens");
  w.counts("/partition/tokens", tokens, "[cp] real tokens of each rank", "tokens");
  w.counts("/partition/pad_tokens", {p.pad_tokens()}, "[1] pad tokens of the split documents", "tokens");
  std::vector<double> work(p.work.begin(), p.work.end());
  w.tensor("/partition/work", Tensor::from(work, {static_cast<std::int64_t>(work.size())}, DType::F64),
           "[cp] work of each rank by the placement's cost model", "pairs");
}
}  // namespace

std::vector<std::int64_t> Study::local_rows() const { return placement.real_index(grid.cp_rank); }

void Study::record_placement(const cp::DocCost& cost) {
  const auto p = placement.docs ? placement.docs : thd_placement(deck, cp, cost);
  if (!p) return;
  if (writer_) write_doc_partition(*writer_, *p);
  if (root()) std::printf("# partition %s: %s\n", deck.get_string("data.partition").c_str(), p->summary().c_str());
}

std::vector<std::string> union_over(Communicator& comm, const std::vector<std::string>& names) {
  std::string mine;
  for (const std::string& n : names) mine += n + '\n';
  const auto n = static_cast<std::int64_t>(comm.all_reduce_scalar(static_cast<double>(mine.size()), ReduceOp::Max));
  std::vector<double> send(static_cast<std::size_t>(n), 0.0), all(static_cast<std::size_t>(n * comm.size()));
  for (std::size_t i = 0; i < mine.size(); ++i) send[i] = static_cast<unsigned char>(mine[i]);
  if (n > 0) comm.all_gather(send.data(), all.data(), n, DType::F64);
  std::set<std::string> out;
  std::string name;
  for (double c : all) {
    if (c == '\n') {
      out.insert(name);
      name.clear();
    } else if (c != 0) {
      name += static_cast<char>(c);
    }
  }
  return {out.begin(), out.end()};
}

}  // namespace hcp::drivers
