#include "cp/placement.hpp"

#include "comm/communicator.hpp"
#include "core/error.hpp"
#include "cp/layout.hpp"

namespace hcp::cp {

Placement Placement::dcs(SeqLayout global, int cp) {
  Placement p;
  p.cp = cp;
  p.global = std::move(global);
  return p;
}

Placement Placement::documents(SeqLayout global, std::shared_ptr<const DocPartition> docs) {
  HCP_CHECK(docs, "Placement::documents: no document placement");
  Placement p;
  p.cp = docs->cp;
  p.global = std::move(global);
  p.docs = std::move(docs);
  return p;
}

std::vector<CpPart> Placement::cp_parts(int rank) const {
  if (!docs) return {CpPart{*this, 0, rank, 0, local_rows(rank)}};
  std::vector<CpPart> out;
  std::int64_t off = docs->whole_rows(rank);
  for (SplitPart& s : docs->split_parts(rank)) {
    const std::int64_t n = s.local_rows();
    out.push_back(CpPart{dcs(std::move(s.layout), s.g), s.block, s.rank_in_block(rank), off, n});
    off += n;
  }
  return out;
}

std::vector<CpPart> Placement::all_parts() const {
  if (!docs) return {CpPart{*this, 0, 0, 0, 0}};
  std::vector<CpPart> out;
  for (int g : docs->group_sizes())
    for (int b = 0; b < cp / g; ++b) {
      SplitPart s = docs->split_part(g, b);
      out.push_back(CpPart{dcs(std::move(s.layout), g), b, 0, 0, 0});
    }
  return out;
}

std::int64_t Placement::local_rows(int rank) const { return docs ? docs->local_rows(rank) : global.total() / cp; }

std::vector<std::int64_t> Placement::batch_index(int rank) const {
  return docs ? docs->real_index(rank) : dcs_global_index(global, cp, rank);
}

std::vector<std::int64_t> Placement::real_index(int rank) const {
  return docs ? docs->real_index(rank) : local_real_index(global, cp, rank);
}

std::vector<std::int64_t> Placement::positions(int rank) const {
  return docs ? docs->positions(rank) : dcs_positions(global, cp, rank);
}

Tensor Placement::gather_real(Communicator& comm, const Tensor& local) const {
  HCP_CHECK(comm.size() == cp, "Placement: placed over ", cp, " ranks, gathered over ", comm.size());
  if (docs) return gather_documents(comm, local, *docs);
  const Tensor all = dcs_gather(comm, local, global);
  return global.padded() ? take_rows(all, real_rows(global)) : all;
}

std::vector<std::int64_t> Placement::take(const std::vector<std::int64_t>& batch_values, int rank,
                                          std::int64_t pad) const {
  std::vector<std::int64_t> out;
  for (const std::int64_t i : batch_index(rank)) out.push_back(i < 0 ? pad : batch_values[static_cast<std::size_t>(i)]);
  return out;
}

}  // namespace hcp::cp
