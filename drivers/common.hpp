// Helpers shared by the drivers: timing statistics, comparisons, sequence-length lists.
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/seq_layout.hpp"
#include "cp/doc_groups.hpp"
#include "cp/documents.hpp"
#include "cp/layout.hpp"
#include "cp/placement.hpp"
#include "io/deck.hpp"
#include "io/results.hpp"

namespace hcp::drivers {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// "100, 37,5" -> {100, 37, 5}; every entry a positive integer.
inline std::vector<std::int64_t> parse_lengths(const Deck& d, const std::string& key) {
  const std::string& s = d.get_string(key);
  const std::string where = d.where(key);
  std::vector<std::int64_t> out;
  std::size_t begin = 0;
  while (true) {  // every comma separates two lengths: "7,,15", "7," and ",7" are refused
    const std::size_t comma = s.find(',', begin);
    std::string item = s.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    HCP_INPUT_CHECK(!item.empty(), where, "key '", key, "' = \"", s, "\": empty length at character ", begin + 1,
                    " (lengths are positive integers separated by single commas)");
    std::size_t pos = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    HCP_INPUT_CHECK(pos == item.size() && v > 0, where, "key '", key, "': '", item,
                    "' is not a positive integer length");
    out.push_back(v);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return out;
}

// The admission check's keys (memory_model.hpp), of every driver that estimates its memory.
inline void add_memory_keys(DeckSchema& s) {
  s.add_string("run.memory_check", "refuse",
               "a run whose estimated memory per rank exceeds the limit (MemAvailable, cgroup limit, GPU free memory): "
               "refuse, warn, off",
               {"refuse", "warn", "off"})
      .add_float("run.memory_gib", 0.0,
                 "memory per rank for the admission check and --dry-run, GiB (0: read it: the smallest of MemAvailable "
                 "and the cgroup limit, or the GPU's free memory, shared among the ranks using it)",
                 0.0);
}

// The deck keys every CP driver reads through global_layout / cp_size_of and its run loop:
// [data] format, seq_lens, batch, seqlen, dtype, seed; [parallel] cp_size; [run] warmup, repeats,
// check. Defaults of the sizes are the driver's own.
inline void add_cp_driver_keys(DeckSchema& s, const std::string& seq_lens_default, std::int64_t seqlen_default,
                               bool with_bf16 = false) {
  std::vector<std::string> dtypes = {"fp32", "fp64"};
  if (with_bf16) dtypes.push_back("bf16");
  s.add_string("data.format", "thd", "token layout", {"bshd", "thd"})
      .add_string("data.seq_lens", seq_lens_default,
                  "THD sequence lengths: comma-separated, or an array (padded to 2*cp)")
      .add_int("data.batch", 2, "BSHD batch size", 1)
      .add_int("data.seqlen", seqlen_default, "BSHD sequence length (multiple of 2*cp)", 1)
      .add_string("data.dtype", "fp64",
                  with_bf16 ? "precision of the run (bf16: bf16 storage, fp32 compute, LSE and reductions)"
                            : "precision of the run",
                  dtypes)
      .add_int("data.seed", 1, "seed of inputs and parameters", 0)
      .add_int("parallel.cp_size", 0, "CP group size (0: world size)", 0)
      .add_int("run.warmup", 1, "untimed iterations", 0)
      .add_int("run.repeats", 3, "timed iterations", 1)
      .add_string(
          "run.check", "reference",
          "reference: every strategy against the unpadded cp=1 problem on rank 0 (which holds it whole); cross: "
          "every strategy against the first, shard by shard on each rank (no rank holds the global problem); off",
          {"reference", "cross", "off"})
      .add_string("run.plant_fault", "",
                  "for testing the checks: the case (strategy) whose first checked result gets one element moved by "
                  "1e-3 of its largest magnitude, so that the run must FAIL (\"\": none)")
      .add_string(
          "run.save", "auto",
          "what the results file keeps, comma-separated or an array: all | auto (all but inputs and tensors over 2^27 "
          "elements) | activations | gradients | timings | comm | memory | summary (errors, statistics of every "
          "tensor) | inputs (inputs and parameters: the results can be checked from the file alone) | tensor names")
      .add_string("run.hdf5_io", "auto",
                  "how tensors are written: collective (parallel HDF5, each rank its rows), gather (rank 0 writes), "
                  "auto (collective when HDF5 has MPI)",
                  {"auto", "collective", "gather"})
      .list("data.seq_lens")
      .list("run.save");
  add_memory_keys(s);
}

// run.save, checked (the deck's file:line and the key name a bad item).
inline SaveSet save_set(const Deck& d) {
  try {
    return SaveSet(d.get_string("run.save"));
  } catch (const Error& e) {
    HCP_INPUT_CHECK(false, d.where("run.save"), "key 'run.save': ", e.what());
  }
  return {};
}

// run.hdf5_io: collective writes need HDF5 built with MPI.
inline H5Io hdf5_io(const Deck& d) {
  const std::string& v = d.get_string("run.hdf5_io");
  HCP_INPUT_CHECK(
      v != "collective" || hdf5_parallel(), d.where("run.hdf5_io"),
      "key 'run.hdf5_io' = \"collective\" needs HDF5 built with MPI; this build's HDF5 is serial (use gather or auto)");
  return v == "gather" || (v == "auto" && !hdf5_parallel()) ? H5Io::Gather : H5Io::Collective;
}

// data.partition = documents (cp/documents.hpp) or groups (cp/doc_groups.hpp), for the drivers that
// run them: whole documents on one rank, long ones split by DualChunkSwap over the CP group or over
// the smallest block of ranks that balances; data.doc_split_len and data.doc_groups set the rules.
inline void add_partition_keys(DeckSchema& s) {
  s.add_string("data.partition", "dcs",
               "how packed (THD) sequences lie on the CP ranks: dcs (every sequence padded to 2*cp and cut into "
               "DualChunkSwap chunks on every rank), documents (a document whole on one rank, chosen to balance the "
               "work, or split by DualChunkSwap over the CP group when it is too long to keep whole) or groups (as "
               "documents, a split document over the smallest block of consecutive ranks that balances the work)",
               {"dcs", "documents", "groups"})
      .add_int("data.doc_split_len", 0,
               "data.partition = documents: documents of at least this many tokens are split over the CP group (0: "
               "chosen: the fewest heaviest documents whose split brings the heaviest rank's work within 1.1 x the "
               "mean)",
               0)
      .add_string("data.doc_groups", "pow2",
                  "data.partition = groups: the sizes of the blocks a split document may run on: pow2 (powers of two "
                  "dividing the CP size) or any (every divisor)",
                  {"pow2", "any"});
}

// data.partition = documents or groups: a placement per document.
inline bool by_documents(const Deck& d) { return d.has("data.partition") && d.get_string("data.partition") != "dcs"; }

// The work of one attention layer alone: its (query, key) pairs.
inline cp::DocCost attention_doc_cost(bool causal) { return {1.0, 0.0, causal}; }

// The work of a layer linear in the tokens (Mamba2, MoE, MLP): its tokens.
inline cp::DocCost token_doc_cost() { return {0.0, 1.0, true}; }

// The per-document placement of data.seq_lens on `cp` ranks (data.partition = documents), work by
// `cost`; null for data.partition = dcs.
inline std::shared_ptr<const cp::DocPartition> doc_partition(const Deck& d, const std::vector<std::int64_t>& lens,
                                                             int cp, const cp::DocCost& cost) {
  if (!by_documents(d)) return nullptr;
  const std::string& part = d.get_string("data.partition");
  HCP_INPUT_CHECK(d.get_string("data.format") == "thd", d.where("data.partition"), "data.partition = \"", part,
                  "\" places packed documents: it needs data.format = \"thd\"");
  if (part == "groups") {
    HCP_INPUT_CHECK(d.get_int("data.doc_split_len") == 0, d.where("data.doc_split_len"),
                    "data.doc_split_len sets which documents data.partition = \"documents\" splits; with "
                    "\"groups\" the split is chosen with the group sizes (leave it 0)");
    return std::make_shared<const cp::DocPartition>(cp::place_document_groups(
        lens, cp, cost,
        d.get_string("data.doc_groups") == "any" ? cp::GroupSizes::Divisors : cp::GroupSizes::PowersOfTwo));
  }
  return std::make_shared<const cp::DocPartition>(
      cp::partition_documents(lens, cp, d.get_int("data.doc_split_len"), cost));
}
inline std::shared_ptr<const cp::DocPartition> doc_partition(const Deck& d, int cp, const cp::DocCost& cost) {
  if (!by_documents(d)) return nullptr;
  return doc_partition(d, parse_lengths(d, "data.seq_lens"), cp, cost);
}

// The global, padded token layout from the [data] section: BSHD (data.batch x data.seqlen, the
// length a multiple of 2*cp) or THD (data.seq_lens, each padded up to a multiple of 2*cp; the real
// lengths kept in real_lens).
inline SeqLayout global_layout(const Deck& d, int cp) {
  if (by_documents(d)) {  // the documents unpadded; where they lie is the placement's
    std::vector<std::int64_t> cu{0};
    for (auto n : parse_lengths(d, "data.seq_lens")) cu.push_back(cu.back() + n);
    return SeqLayout::thd(cu);
  }
  if (d.get_string("data.format") == "bshd") {
    const std::int64_t L = d.get_int("data.seqlen");
    // cp = 1 runs the unsharded problem: any length
    HCP_INPUT_CHECK(cp == 1 || L % (2 * cp) == 0, d.where("data.seqlen"), "data.seqlen = ", L,
                    " must be a multiple of 2*cp = ", 2 * cp, " (DualChunkSwap)");
    return SeqLayout::bshd(d.get_int("data.batch"), L);
  }
  std::vector<std::int64_t> cu{0};
  const std::vector<std::int64_t> lens = parse_lengths(d, "data.seq_lens");
  for (auto n : lens) cu.push_back(cu.back() + cp::dcs_padded_len(n, cp));
  SeqLayout l = SeqLayout::thd(cu);
  l.real_lens = lens;  // the pads at each sequence's end are neither keys nor outputs
  return l;
}

// The deck's batch placed on `cp` ranks: per document (data.partition = documents, work by `cost`)
// or DualChunkSwap of global_layout.
inline cp::Placement placement_of(const Deck& d, int cp, const cp::DocCost& cost) {
  SeqLayout g = global_layout(d, cp);
  if (auto docs = doc_partition(d, cp, cost)) return cp::Placement::documents(std::move(g), std::move(docs));
  return cp::Placement::dcs(std::move(g), cp);
}

// Where the documents of a packed (THD) batch lie, as a placement, whatever data.partition says:
// the per-document one, or for dcs every document split (the DualChunkSwap layout); null for BSHD.
inline std::shared_ptr<const cp::DocPartition> thd_placement(const Deck& d, int cp, const cp::DocCost& cost) {
  if (auto p = doc_partition(d, cp, cost)) return p;
  if (d.get_string("data.format") != "thd") return nullptr;
  return std::make_shared<const cp::DocPartition>(
      cp::partition_documents(parse_lengths(d, "data.seq_lens"), cp, 1, cost));
}

// CP size from parallel.cp_size (0: every rank), checked against the world size.
inline int cp_size_of(const Deck& d, int world) {
  const int cp = d.get_int("parallel.cp_size") == 0 ? world : static_cast<int>(d.get_int("parallel.cp_size"));
  HCP_INPUT_CHECK(world % cp == 0, d.where("parallel.cp_size"), "parallel.cp_size = ", cp,
                  " must divide the number of ranks (", world, ")");
  return cp;
}

}  // namespace hcp::drivers
