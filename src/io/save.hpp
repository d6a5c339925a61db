// What a results file keeps (run.save) and how it is written (HDF5 with or without MPI-IO).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hcp {

enum class H5Io { Gather, Collective };
// True when this build's HDF5 has MPI-IO (H5Io::Collective can be used).
bool hdf5_parallel();
std::string to_string(H5Io io);

// What a run keeps (the deck's run.save, comma-separated):
//   all          everything
//   auto         everything, except tensors of more than kAutoMaxElements elements (their statistics stay)
//   activations, gradients, timings, comm, memory, summary (errors against cp=1 and /stats)   one class each
//   inputs       what the run starts from, so that its results can be checked from the file alone:
//                /inputs/<tensor> (real tokens, global order), /inputs/cu_seqlens, /inputs/params/<name>
//                (kept by "all" and "inputs", not by "auto")
//   any other item names tensors: a path below the root ("activations/p2p", "gradients/p2p/dq") or
//   a last component ("dq", "block_3") keeps every tensor it names, in every class.
// /config is always kept; so are train_hybrid's /train, /params and checkpoints.
class SaveSet {
 public:
  static constexpr std::int64_t kAutoMaxElements = std::int64_t{1} << 27;  // 512 MiB in fp32
  SaveSet() : SaveSet("all") {}
  explicit SaveSet(const std::string& list);  // throws hcp::Error naming a malformed item
  bool keeps(const std::string& path, std::int64_t numel) const;
  bool keeps_class(const std::string& cls) const;
  // The first tensor-name item that names none of `tensors` (the dataset paths a run writes under
  // /activations and /gradients), or "" when every item names something.
  std::string unmatched(const std::vector<std::string>& tensors) const;
  const std::string& text() const { return text_; }

 private:
  std::string text_;
  std::vector<std::string> items_;
};

}  // namespace hcp
