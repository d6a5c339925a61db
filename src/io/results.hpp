// HDF5 results files (schema in README.md):
//   /config        attributes: deck text, command line, git revision, sizes, strategy, backend, dtype,
//                  `hdf5_io` (how tensors were written) and `save` (what the run keeps)
//   /activations/<layer>/<name>, /gradients/<name>   tensors in global order, attrs `layout`, `units`
//   /stats/<tensor path>   attributes l2, max_abs, mean, count, nonfinite of every tensor (fp64, every
//                  rank's part), also of tensors the run does not keep
//   /timings/<phase>   [ranks, repeats] in ms, per rank
//   /comm/<op>         per-rank bytes_sent, seconds, calls ([ranks] datasets in a group per op)
//   /summary/<name>    attributes max_abs, max_rel, tolerance, pass
//   /inputs/<name>     the run's inputs and parameters (run.save = inputs or all)
// Every rank calls every method with the same paths, in the same order (collective); values that
// only rank 0 holds (a reference tensor, an error) are rank 0's. Two ways to write:
//   Gather      rank 0 alone opens the file; a distributed tensor (rows()) is sent to rank 0 and
//               written whole: rank 0 needs the global tensor's memory. Serial HDF5 has only this.
//   Collective  every rank opens the file through MPI-IO (parallel HDF5) and writes its own rows of a
//               distributed tensor as a hyperslab selection, in one collective H5Dwrite; rank 0
//               writes what only it holds. No rank holds more than its share.
// Both give the same datasets, attributes and chunking. The file is created at the first write as
// "<path>.tmp-<pid of rank 0>" and renamed to <path> by finish(); an abandoned writer, SIGTERM or
// SIGINT removes it. A failed write names the file, the dataset or attribute and the system's reason.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/tensor.hpp"
#include "io/results_reader.hpp"
#include "io/save.hpp"

namespace hcp {

class ResultsWriter {
 public:
  // `comm` must be an MpiCommunicator for H5Io::Collective (and HDF5 built with MPI).
  ResultsWriter(const std::string& path, Communicator& comm, H5Io io = H5Io::Gather, SaveSet save = SaveSet());
  ~ResultsWriter();
  ResultsWriter(const ResultsWriter&) = delete;
  ResultsWriter& operator=(const ResultsWriter&) = delete;

  // String attributes of /config (rank 0's values are written).
  void config(const std::map<std::string, std::string>& attrs);
  void config_int(const std::string& name, std::int64_t v);
  // A tensor that rank 0 holds in global order (other ranks pass anything; ignored).
  void tensor(const std::string& path, const Tensor& t, const std::string& layout, const std::string& units) {
    write_tensor(path, t, layout, units, false);
  }
  // A count per entry (ranks, tokens, owners): rank 0's, written as an int64 dataset.
  void counts(const std::string& path, const std::vector<std::int64_t>& v, const std::string& layout,
              const std::string& units);
  // A tensor distributed by rows: this rank's `local` [R, ...] (any space, dtype, strides), and for
  // each local row its row in the file's [total_rows, ...] dataset, or -1 for a row not written (a pad,
  // or a row another rank writes). Every file row must come from exactly one rank.
  void rows(const std::string& path, const Tensor& local, const std::vector<std::int64_t>& file_row,
            std::int64_t total_rows, const std::string& layout, const std::string& units);
  // Per-rank samples (ms): gathered into /timings/<phase> [ranks, repeats]. Same repeats on every rank.
  void timings(const std::string& phase, const std::vector<double>& ms_per_repeat);
  // One figure per rank at `path` ([ranks] dataset, e.g. /memory/<strategy>/<what>).
  void per_rank(const std::string& path, double v, const std::string& units);
  // Per-rank communicator counters summed over `steps` timed steps, written per step:
  // /comm/<prefix><op>/{bytes_sent,calls} (int64) and seconds [ranks]; `equal`: every step made the
  // same calls with the same bytes (attribute steps_equal; otherwise the figures are means).
  void comm(const std::map<std::string, CommCounter>& counters, int steps, bool equal, const std::string& prefix = "");
  // /summary/<name> with max_abs, max_rel, tolerance and pass (1/0).
  void summary(const std::string& name, double max_abs, double max_rel, double tol, bool pass);
  // /summary/<prefix>/<name> of each of rank 0's relative errors (other ranks pass any list): the
  // error as max_abs and max_rel, pass when within `tol`.
  void summaries(const std::string& prefix, const std::vector<std::pair<std::string, double>>& rel, double tol);
  // A string attribute of the group or dataset at `path` (written before; rank 0's value).
  void attribute(const std::string& path, const std::string& name, const std::string& value);
  void finish();  // close and rename; collective

  const std::string& path() const { return path_; }
  H5Io io() const { return io_; }
  const SaveSet& save() const { return save_; }

 private:
  void write_tensor(const std::string& path, const Tensor& t, const std::string& layout, const std::string& units,
                    bool integer);
  bool writes() const;         // does this rank make HDF5 calls
  void open();                 // creates the temporary file on first use
  void bcast(std::string& s);  // rank 0's value on every rank (collective mode)
  void bcast(double* v, int n);
  void stats(const std::string& path, double sum, double sumsq, double max_abs, double count, double nonfinite);
  void dataset(const std::string& path, const Tensor* data, const Shape& shape, DType dt, const std::string& layout,
               const std::string& units, const std::vector<std::int64_t>* file_rows);
  long long group(const std::string& path);  // creates intermediate groups, returns hid_t
  void string_attr(long long obj, const std::string& name, const std::string& v);
  void double_attr(long long obj, const std::string& name, double v, bool integer = false);
  Communicator& comm_;
  H5Io io_;
  SaveSet save_;
  void* mpi_comm_ = nullptr;  // MPI_Comm of the collective mode
  std::string path_, tmp_;
  long long file_ = -1;
  bool done_ = false;
};

}  // namespace hcp
