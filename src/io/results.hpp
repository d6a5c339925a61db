// HDF5 results files (schema in README.md):
//   /config        attributes: deck text, command line, git revision, sizes, strategy, backend, dtype
//   /activations/<layer>/<name>, /gradients/<name>   tensors in global order, attrs `layout`, `units`
//   /timings/<phase>   [ranks, repeats] in ms, per rank
//   /comm/<op>         per-rank bytes_sent, seconds, calls ([ranks] datasets in a group per op)
//   /summary/<name>    attributes max_abs, max_rel, tolerance, pass
// Every rank calls every method (collective); rank 0 writes. The file is created at the first write
// as "<path>.tmp-<pid>" and renamed to <path> by finish(); an abandoned writer, SIGTERM or SIGINT
// removes it. A failed write names the file, the dataset or attribute and the system's reason.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/tensor.hpp"

namespace hcp {

class ResultsWriter {
 public:
  ResultsWriter(const std::string& path, Communicator& comm);
  ~ResultsWriter();
  ResultsWriter(const ResultsWriter&) = delete;
  ResultsWriter& operator=(const ResultsWriter&) = delete;

  // String attributes of /config (rank 0's values are written).
  void config(const std::map<std::string, std::string>& attrs);
  void config_int(const std::string& name, std::int64_t v);
  // A tensor that rank 0 holds in global order (other ranks pass anything; ignored).
  void tensor(const std::string& path, const Tensor& t, const std::string& layout, const std::string& units);
  // Per-rank samples (ms): gathered into /timings/<phase> [ranks, repeats]. Same repeats on every rank.
  void timings(const std::string& phase, const std::vector<double>& ms_per_repeat);
  // Per-rank communicator counters: /comm/<prefix><op>/{bytes_sent,seconds,calls} [ranks].
  void comm(const Communicator& c, const std::string& prefix = "");
  // /summary/<name> with max_abs, max_rel, tolerance and pass (1/0).
  void summary(const std::string& name, double max_abs, double max_rel, double tol, bool pass);
  // A string attribute of the group or dataset at `path` (written before; rank 0's value).
  void attribute(const std::string& path, const std::string& name, const std::string& value);
  void finish();  // close and rename; collective

  const std::string& path() const { return path_; }

 private:
  void open();                               // creates the temporary file on first use (rank 0)
  long long group(const std::string& path);  // creates intermediate groups, returns hid_t
  void string_attr(long long obj, const std::string& name, const std::string& v);
  void double_attr(long long obj, const std::string& name, double v);
  Communicator& comm_;
  std::string path_, tmp_;
  long long file_ = -1;
  bool done_ = false;
};

// Order-dependent 64-bit checksum of a tensor's values (each as the bits of its double value), as
// 16 hex digits: the same for a tensor and for what a ResultsReader reads back of it.
std::string checksum(const Tensor& t);

// Reading back (single process): datasets as double tensors, string/double attributes.
class ResultsReader {
 public:
  explicit ResultsReader(const std::string& path);
  ~ResultsReader();
  ResultsReader(const ResultsReader&) = delete;
  ResultsReader& operator=(const ResultsReader&) = delete;
  bool exists(const std::string& path) const;
  Tensor read(const std::string& path, DType dt = DType::F64) const;
  std::string string_attr(const std::string& obj, const std::string& name) const;
  double double_attr(const std::string& obj, const std::string& name) const;

 private:
  std::string path_;
  long long file_ = -1;
};

}  // namespace hcp
