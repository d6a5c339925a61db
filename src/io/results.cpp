#include "io/results.hpp"

#include <hdf5.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "comm/mpi_communicator.hpp"
#include "io/h5_util.hpp"
#include "io/manifest.hpp"

namespace hcp {
namespace {

hid_t h5_type(DType dt) { return dt == DType::F64 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT; }

// A host, contiguous, fp32/fp64 copy (bf16 widened to fp32) of any tensor, for writing.
Tensor writable(const Tensor& t) {
  // bf16 on the GPU is widened there (one kernel), then copied.
  Tensor c = t.space() == Space::Cuda ? (t.dtype() == DType::BF16 ? t.to(DType::F32) : t).to(Space::Host) : t;
  if (c.dtype() == DType::BF16) return c.to(DType::F32);
  return c.is_contiguous() ? c : c.clone();
}

// Creates dataset `name` under `loc`; chunk_rows > 0 chunks it by rows ([chunk_rows, rest...]).
hid_t create_dataset(hid_t loc, const std::string& name, const Shape& shape, DType dt, std::int64_t chunk_rows,
                     const std::string& file, const std::string& what) {
  std::vector<hsize_t> dims;
  for (auto d : shape) dims.push_back(static_cast<hsize_t>(d));
  if (dims.empty()) dims.push_back(1);
  hid_t space = HCP_H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  hid_t dcpl = HCP_H5_CHECK(H5Pcreate(H5P_DATASET_CREATE));
  if (chunk_rows > 0 && dims[0] > 0) {
    std::vector<hsize_t> chunk = dims;
    chunk[0] = static_cast<hsize_t>(chunk_rows);
    HCP_H5_CHECK(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()));
  }
  hid_t ds =
      HCP_H5_WRITE(H5Dcreate2(loc, name.c_str(), h5_type(dt), space, H5P_DEFAULT, dcpl, H5P_DEFAULT), file, what);
  H5Pclose(dcpl);
  H5Sclose(space);
  return ds;
}

// Rows per chunk of a row-distributed dataset: about 4 MiB a chunk (a typical parallel file system
// stripe), at least one row, at most every row.
std::int64_t chunk_rows_for(std::int64_t rows, std::int64_t row_bytes) {
  constexpr std::int64_t kChunkBytes = std::int64_t{4} << 20;
  return std::max<std::int64_t>(1, std::min(rows, kChunkBytes / std::max<std::int64_t>(row_bytes, 1)));
}

// Writes the whole of `ds` from rank 0's `data`. Collective mode: one collective call in which the
// other ranks select nothing.
void write_from_root(hid_t ds, DType dt, const void* data, bool collective, bool root, const std::string& file,
                     const std::string& what) {
  hid_t fs = HCP_H5_CHECK(H5Dget_space(ds));
  hid_t dxpl = HCP_H5_CHECK(H5Pcreate(H5P_DATASET_XFER));
#ifdef H5_HAVE_PARALLEL
  if (collective) HCP_H5_CHECK(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
#endif
  hid_t ms = HCP_H5_CHECK(H5Scopy(fs));
  if (!root) H5Sselect_none(fs), H5Sselect_none(ms);
  HCP_H5_WRITE(H5Dwrite(ds, h5_type(dt), ms, fs, dxpl, root ? data : nullptr), file, what);
  H5Sclose(ms);
  H5Pclose(dxpl);
  H5Sclose(fs);
}

std::pair<std::string, std::string> split_path(const std::string& p) {
  auto pos = p.rfind('/');
  if (pos == std::string::npos) return {"/", p};
  return {pos == 0 ? "/" : p.substr(0, pos), p.substr(pos + 1)};
}

// The unfinished results file of this process, removed when SIGTERM or SIGINT ends it (a SIGKILL
// cannot be caught: a `.tmp-<pid>` that remains is an unfinished file, and hcp_post refuses it).
// Beside it, the file Open MPI's MPI-IO makes for a moment while it opens a file collectively, to
// learn whether the file system locks ("<file>.locktest.<rank>"): a signal in that moment leaves it.
char g_tmp_path[4096] = {0};
char g_lock_path[4096] = {0};
struct sigaction g_old_term, g_old_int;

extern "C" void remove_tmp_and_reraise(int sig) {
  if (g_tmp_path[0]) unlink(g_tmp_path);  // async-signal-safe
  if (g_lock_path[0]) unlink(g_lock_path);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}
void guard_tmp(const std::string& path, int rank) {
  const std::string lock = path + ".locktest." + std::to_string(rank);
  if (lock.size() >= sizeof(g_lock_path)) return;
  std::memcpy(g_tmp_path, path.c_str(), path.size() + 1);
  std::memcpy(g_lock_path, lock.c_str(), lock.size() + 1);
  struct sigaction sa {};
  sa.sa_handler = remove_tmp_and_reraise;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGINT, &sa, &g_old_int);
}
void unguard_tmp() {
  if (!g_tmp_path[0]) return;
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGINT, &g_old_int, nullptr);
  g_tmp_path[0] = 0;
  g_lock_path[0] = 0;
}

}  // namespace

// ---- writer ------------------------------------------------------------------------------------
// The output folder was checked before any work (run_driver); the file itself is created when the
// first result is written, so that a run which fails or is killed before then leaves nothing.
ResultsWriter::ResultsWriter(const std::string& path, Communicator& comm, H5Io io, SaveSet save)
    : comm_(comm), io_(io), save_(std::move(save)), path_(path) {
  if (io_ == H5Io::Collective) {
    HCP_CHECK(hdf5_parallel(), "collective HDF5 writes need HDF5 built with MPI (this build's is serial)");
    auto* m = dynamic_cast<MpiCommunicator*>(&comm);
    HCP_CHECK(m != nullptr, "collective HDF5 writes need an MPI communicator");
    mpi_comm_ = new MPI_Comm(m->handle());
  }
}

ResultsWriter::~ResultsWriter() {
  // Closing a file opened through MPI-IO is collective: while an exception unwinds one rank (the
  // driver then ends every rank), the file is left open rather than waited on.
  const bool can_close = io_ == H5Io::Gather || std::uncaught_exceptions() == 0;
  if (file_ >= 0 && can_close) H5Fclose(file_);
  if (!done_ && !tmp_.empty() && comm_.rank() == 0) std::remove(tmp_.c_str());
  if (!tmp_.empty()) unguard_tmp();
  delete static_cast<MPI_Comm*>(mpi_comm_);
}

bool ResultsWriter::writes() const { return io_ == H5Io::Collective || comm_.rank() == 0; }

void ResultsWriter::bcast(std::string& v) {
  if (io_ != H5Io::Collective) return;
  MPI_Comm c = *static_cast<MPI_Comm*>(mpi_comm_);
  unsigned long long n = v.size();
  HCP_MPI_CHECK(MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, c));
  v.resize(n);
  if (n > 0) HCP_MPI_CHECK(MPI_Bcast(v.data(), static_cast<int>(n), MPI_CHAR, 0, c));
}

void ResultsWriter::bcast(double* v, int n) {
  if (io_ == H5Io::Collective) comm_.broadcast(v, n, DType::F64, 0);
}

void ResultsWriter::open() {
  if (file_ >= 0) return;
  double pid = static_cast<double>(getpid());
  bcast(&pid, 1);  // one temporary name: rank 0's
  tmp_ = path_ + ".tmp-" + std::to_string(static_cast<long long>(pid));
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  errno = 0;
  hid_t fapl = HCP_H5_CHECK(H5Pcreate(H5P_FILE_ACCESS));
#ifdef H5_HAVE_PARALLEL
  if (io_ == H5Io::Collective) {
    HCP_H5_CHECK(H5Pset_fapl_mpio(fapl, *static_cast<MPI_Comm*>(mpi_comm_), MPI_INFO_NULL));
    HCP_H5_CHECK(H5Pset_coll_metadata_write(fapl, true));
  }
#endif
  // Armed before the create, on every rank that opens the file: a SIGTERM while the file is being
  // made removes it on whichever rank receives it, whatever mpirun then does to the others. Only
  // rank 0 creates; in collective mode the others open what it made without O_CREAT, so a rank
  // still opening after another removed the file fails instead of making it again.
  guard_tmp(tmp_, comm_.rank());
  std::string why;
  if (io_ == H5Io::Collective) {
    double made = 1;
    if (comm_.rank() == 0) {
      hid_t first = H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
      if (first < 0)
        made = 0, why = h5_reason();
      else
        H5Fclose(first);
    }
    comm_.broadcast(&made, 1, DType::F64, 0);
    if (made == 1) file_ = H5Fopen(tmp_.c_str(), H5F_ACC_RDWR, fapl);
    if (made == 1 && file_ < 0) why = h5_reason();
  } else {
    file_ = H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    if (file_ < 0) why = h5_reason();
  }
  H5Pclose(fapl);
  if (file_ < 0) {
    unguard_tmp();
    if (comm_.rank() == 0) std::remove(tmp_.c_str());
    tmp_.clear();
    throw Error(detail::concat("cannot create results file '", path_, "': ", why.empty() ? "see rank 0" : why));
  }
}

long long ResultsWriter::group(const std::string& path) {
  open();
  hid_t g = HCP_H5_CHECK(H5Gopen2(file_, "/", H5P_DEFAULT));
  std::size_t start = 1;
  while (start <= path.size()) {
    auto end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string name = path.substr(start, end - start);
    if (!name.empty()) {
      hid_t next;
      if (H5Lexists(g, name.c_str(), H5P_DEFAULT) > 0)
        next = HCP_H5_CHECK(H5Gopen2(g, name.c_str(), H5P_DEFAULT));
      else
        next = HCP_H5_WRITE(H5Gcreate2(g, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path_,
                            "group " + path.substr(0, end));
      H5Gclose(g);
      g = next;
    }
    start = end + 1;
  }
  return g;
}

void ResultsWriter::attribute(const std::string& path, const std::string& name, const std::string& value) {
  std::string v = value;
  bcast(v);
  if (!writes()) return;
  open();
  // A group run.save left out has no object to carry the attribute: nothing to write. Each link
  // is looked up in turn (H5Oexists_by_name fails on a missing intermediate group).
  for (std::size_t end = path.find('/', 1);; end = path.find('/', end + 1)) {
    const std::string part = path.substr(0, end);
    if (part.size() > 1 && H5Lexists(file_, part.c_str(), H5P_DEFAULT) <= 0) return;
    if (end == std::string::npos) break;
  }
  hid_t o = HCP_H5_CHECK(H5Oopen(file_, path.c_str(), H5P_DEFAULT));
  string_attr(o, name, v);
  H5Oclose(o);
}

void ResultsWriter::string_attr(long long obj, const std::string& name, const std::string& v) {
  hid_t type = HCP_H5_CHECK(H5Tcopy(H5T_C_S1));
  HCP_H5_CHECK(H5Tset_size(type, H5T_VARIABLE));
  HCP_H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  hid_t space = HCP_H5_CHECK(H5Screate(H5S_SCALAR));
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  hid_t a =
      HCP_H5_WRITE(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), path_, "attribute " + name);
  const char* s = v.c_str();
  HCP_H5_WRITE(H5Awrite(a, type, &s), path_, "attribute " + name);
  H5Aclose(a);
  H5Sclose(space);
  H5Tclose(type);
}

void ResultsWriter::double_attr(long long obj, const std::string& name, double v, bool integer) {
  hid_t space = HCP_H5_CHECK(H5Screate(H5S_SCALAR));
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  // an integer is stored as int64, converted by HDF5 from the double in memory
  hid_t a = HCP_H5_WRITE(
      H5Acreate2(obj, name.c_str(), integer ? H5T_STD_I64LE : H5T_NATIVE_DOUBLE, space, H5P_DEFAULT, H5P_DEFAULT),
      path_, "attribute " + name);
  HCP_H5_WRITE(H5Awrite(a, H5T_NATIVE_DOUBLE, &v), path_, "attribute " + name);
  H5Aclose(a);
  H5Sclose(space);
}

void ResultsWriter::config(const std::map<std::string, std::string>& attrs) {
  std::string n = std::to_string(attrs.size());
  bcast(n);
  std::vector<std::pair<std::string, std::string>> kv(attrs.begin(), attrs.end());
  kv.resize(std::stoul(n));
  for (auto& [k, v] : kv) bcast(k), bcast(v);
  if (!writes()) return;
  hid_t g = group("/config");
  for (auto& [k, v] : kv) string_attr(g, k, v);
  string_attr(g, "hdf5_io", to_string(io_));
  string_attr(g, "save", save_.text());
  H5Gclose(g);
}

void ResultsWriter::config_int(const std::string& name, std::int64_t v) {
  double x = static_cast<double>(v);  // rank 0's, exact below 2^53
  bcast(&x, 1);
  if (!writes()) return;
  hid_t g = group("/config");
  double_attr(g, name, x, /*integer=*/true);
  H5Gclose(g);
}

void ResultsWriter::stats(const std::string& path, double sum, double sumsq, double max_abs, double count,
                          double nonfinite) {
  if (!save_.keeps_class("summary") || !writes()) return;
  hid_t g = group("/stats" + path);
  double_attr(g, "l2", std::sqrt(sumsq));
  double_attr(g, "max_abs", max_abs);
  double_attr(g, "mean", count > 0 ? sum / count : 0.0);
  double_attr(g, "count", count);
  double_attr(g, "nonfinite", nonfinite);
  H5Gclose(g);
}

namespace {
// fp64 partial statistics of rows of a host [R, row] tensor: sum, sum of squares, max |x| (NaN if
// any), element count, non-finite count; rows in the order given.
struct Partial {
  double v[5] = {0, 0, 0, 0, 0};
  // Rows of a writable() tensor (host, contiguous, fp32 or fp64).
  void add(const Tensor& c, std::int64_t row, std::int64_t row_len) {
    if (c.dtype() == DType::F32)
      add(static_cast<const float*>(c.raw()) + row * row_len, row_len);
    else
      add(static_cast<const double*>(c.raw()) + row * row_len, row_len);
  }
  template <class T>
  void add(const T* p, std::int64_t n) {
    for (std::int64_t j = 0; j < n; ++j) {
      const double x = p[j];
      v[0] += x, v[1] += x * x, v[2] = nan_max(v[2], std::abs(x)), v[3] += 1;
      if (!std::isfinite(x)) v[4] += 1;
    }
  }
};
}  // namespace

void ResultsWriter::counts(const std::string& path, const std::vector<std::int64_t>& v, const std::string& layout,
                           const std::string& units) {
  std::vector<double> d(v.begin(), v.end());  // exact below 2^53
  write_tensor(path, Tensor::from(d, {static_cast<std::int64_t>(d.size())}, DType::F64), layout, units, true);
}

void ResultsWriter::write_tensor(const std::string& path, const Tensor& t, const std::string& layout,
                                 const std::string& units, bool integer) {
  // Rank 0's tensor: its shape, dtype and statistics on every rank (collective mode).
  if (!writes()) return;
  Tensor c;
  Partial st;
  std::vector<double> meta;  // dtype code (0 fp64, 1 fp32, 2 bf16), rank, dims
  if (comm_.rank() == 0) {
    c = writable(t);
    st.add(c, 0, c.numel());
    meta = {t.dtype() == DType::F64 ? 0.0 : t.dtype() == DType::F32 ? 1.0 : 2.0, static_cast<double>(c.dim())};
    for (auto d : c.shape()) meta.push_back(static_cast<double>(d));
  }
  double nmeta = static_cast<double>(meta.size());
  bcast(&nmeta, 1);
  meta.resize(static_cast<std::size_t>(nmeta));
  bcast(meta.data(), static_cast<int>(nmeta));
  bcast(st.v, 5);
  const DType orig = meta[0] == 0 ? DType::F64 : meta[0] == 1 ? DType::F32 : DType::BF16;
  const Shape shape(meta.begin() + 2, meta.end());
  stats(path, st.v[0], st.v[1], st.v[2], st.v[3], st.v[4]);
  if (!save_.keeps(path, numel_of(shape)) || !writes()) return;
  auto [dir, name] = split_path(path);
  const std::string what = "dataset " + path;
  hid_t g = group(dir);
  const DType wdt = orig == DType::F64 ? DType::F64 : DType::F32;
  hid_t ds = -1;
  if (integer) {  // int64 in the file, converted from the doubles in memory by HDF5
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    if (dims.empty()) dims.push_back(1);
    hid_t space = HCP_H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
    ds = HCP_H5_WRITE(H5Dcreate2(g, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path_,
                      what);
    H5Sclose(space);
  } else {
    ds = create_dataset(g, name, shape, wdt, 0, path_, what);
  }
  write_from_root(ds, wdt, comm_.rank() == 0 ? c.raw() : nullptr, io_ == H5Io::Collective, comm_.rank() == 0, path_,
                  what);
  string_attr(ds, "layout", layout);
  string_attr(ds, "units", units);
  string_attr(ds, "dtype", integer ? "int64" : to_string(orig));
  H5Dclose(ds);
  H5Gclose(g);
}

void ResultsWriter::rows(const std::string& path, const Tensor& local, const std::vector<std::int64_t>& file_row,
                         std::int64_t total_rows, const std::string& layout, const std::string& units) {
  HCP_CHECK(local.dim() >= 1 && static_cast<std::int64_t>(file_row.size()) == local.size(0), "rows('", path,
            "'): ", file_row.size(), " row indices for ", local.dim() ? local.size(0) : 0, " local rows");
  const Tensor c = writable(local);
  const std::int64_t row_len =
      c.size(0) > 0 ? c.numel() / c.size(0) : numel_of(Shape(c.shape().begin() + 1, c.shape().end()));
  const DType wdt = c.dtype();
  // This rank's rows in file order.
  std::vector<std::pair<std::int64_t, std::int64_t>> mine;  // (file row, local row)
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(file_row.size()); ++i) {
    const std::int64_t f = file_row[static_cast<std::size_t>(i)];
    HCP_CHECK(f < total_rows, "rows('", path, "'): file row ", f, " of local row ", i, " outside [0, ", total_rows,
              ")");
    if (f >= 0) mine.emplace_back(f, i);
  }
  std::sort(mine.begin(), mine.end());
  // Statistics: each rank's fp64 partial sums over its rows in file order, combined in rank order,
  // so both modes (and every rank) hold the same figures.
  Partial st;
  for (auto& [f, i] : mine) st.add(c, i, row_len);
  const int p = comm_.size();
  std::vector<double> part(6 * static_cast<std::size_t>(p));
  const double mine6[6] = {st.v[0], st.v[1], st.v[2], st.v[3], st.v[4], static_cast<double>(mine.size())};
  comm_.all_gather(mine6, part.data(), 6, DType::F64);
  Partial all;
  double rows_written = 0;
  for (int r = 0; r < p; ++r) {
    const double* q = &part[6 * static_cast<std::size_t>(r)];
    all.v[0] += q[0], all.v[1] += q[1], all.v[2] = nan_max(all.v[2], q[2]), all.v[3] += q[3], all.v[4] += q[4];
    rows_written += q[5];
  }
  HCP_CHECK(rows_written == static_cast<double>(total_rows), "rows('", path, "'): the ranks hold ", rows_written,
            " rows for a dataset of ", total_rows);
  stats(path, all.v[0], all.v[1], all.v[2], all.v[3], all.v[4]);
  Shape shape = c.shape();
  shape[0] = total_rows;
  if (!save_.keeps(path, numel_of(shape))) return;

  // This rank's rows, packed in file order.
  const std::size_t esz = dtype_size(wdt);
  const std::int64_t n = static_cast<std::int64_t>(mine.size());
  std::vector<unsigned char> buf(static_cast<std::size_t>(n * row_len) * esz);
  for (std::int64_t k = 0; k < n; ++k)
    std::memcpy(buf.data() + static_cast<std::size_t>(k * row_len) * esz,
                static_cast<const unsigned char*>(c.raw()) +
                    static_cast<std::size_t>(mine[static_cast<std::size_t>(k)].second * row_len) * esz,
                static_cast<std::size_t>(row_len) * esz);
  std::vector<std::int64_t> rows_of_mine(static_cast<std::size_t>(n));
  for (std::int64_t k = 0; k < n; ++k)
    rows_of_mine[static_cast<std::size_t>(k)] = mine[static_cast<std::size_t>(k)].first;

  // Gather mode: rank 0 receives every rank's rows and places them.
  Tensor whole;
  if (io_ == H5Io::Gather) {
    if (comm_.rank() != 0) {
      std::vector<double> idx(rows_of_mine.begin(), rows_of_mine.end());
      if (n > 0) {
        comm_.send(idx.data(), n, DType::F64, 0, 71);
        comm_.send(buf.data(), n * row_len, wdt, 0, 72);
      }
      return;
    }
    whole = Tensor::zeros(shape, wdt, Space::Host);
    auto place = [&](const unsigned char* src, const std::vector<std::int64_t>& at) {
      for (std::size_t k = 0; k < at.size(); ++k)
        std::memcpy(static_cast<unsigned char*>(whole.raw()) + static_cast<std::size_t>(at[k] * row_len) * esz,
                    src + k * static_cast<std::size_t>(row_len) * esz, static_cast<std::size_t>(row_len) * esz);
    };
    place(buf.data(), rows_of_mine);
    for (int r = 1; r < p; ++r) {
      const auto nr = static_cast<std::int64_t>(part[6 * static_cast<std::size_t>(r) + 5]);
      if (nr == 0) continue;
      std::vector<double> idx(static_cast<std::size_t>(nr));
      std::vector<unsigned char> rb(static_cast<std::size_t>(nr * row_len) * esz);
      comm_.recv(idx.data(), nr, DType::F64, r, 71);
      comm_.recv(rb.data(), nr * row_len, wdt, r, 72);
      place(rb.data(), std::vector<std::int64_t>(idx.begin(), idx.end()));
    }
  }

  auto [dir, name] = split_path(path);
  const std::string what = "dataset " + path;
  hid_t g = group(dir);
  hid_t ds = create_dataset(g, name, shape, wdt, chunk_rows_for(total_rows, row_len * static_cast<std::int64_t>(esz)),
                            path_, what);
  if (io_ == H5Io::Gather) {
    write_from_root(ds, wdt, whole.raw(), false, true, path_, what);
  } else {
    // This rank's runs of consecutive file rows, one hyperslab each, written in one collective call.
    hid_t fs = HCP_H5_CHECK(H5Dget_space(ds));
    H5Sselect_none(fs);
    std::vector<hsize_t> start(shape.size(), 0), count(shape.begin(), shape.end());
    for (std::int64_t k = 0; k < n;) {
      std::int64_t e = k + 1;
      while (e < n && rows_of_mine[static_cast<std::size_t>(e)] == rows_of_mine[static_cast<std::size_t>(e - 1)] + 1)
        ++e;
      start[0] = static_cast<hsize_t>(rows_of_mine[static_cast<std::size_t>(k)]);
      count[0] = static_cast<hsize_t>(e - k);
      HCP_H5_CHECK(H5Sselect_hyperslab(fs, H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr));
      k = e;
    }
    const hsize_t mlen = static_cast<hsize_t>(std::max<std::int64_t>(n * row_len, 1));
    hid_t ms = HCP_H5_CHECK(H5Screate_simple(1, &mlen, nullptr));
    if (n == 0) H5Sselect_none(ms);
    hid_t dxpl = HCP_H5_CHECK(H5Pcreate(H5P_DATASET_XFER));
#ifdef H5_HAVE_PARALLEL
    HCP_H5_CHECK(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
#endif
    HCP_H5_WRITE(H5Dwrite(ds, h5_type(wdt), ms, fs, dxpl, buf.data()), path_, what);
    H5Pclose(dxpl);
    H5Sclose(ms);
    H5Sclose(fs);
  }
  string_attr(ds, "layout", layout);
  string_attr(ds, "units", units);
  string_attr(ds, "dtype", to_string(local.dtype()));
  H5Dclose(ds);
  H5Gclose(g);
}

void ResultsWriter::timings(const std::string& phase, const std::vector<double>& ms) {
  const int p = comm_.size();
  std::vector<double> nrep(static_cast<std::size_t>(p));
  const double mine = static_cast<double>(ms.size());
  comm_.all_gather(&mine, nrep.data(), 1, DType::F64);
  for (double n : nrep) HCP_CHECK(n == mine, "timings('", phase, "'): ranks recorded different repeat counts");
  const auto r = static_cast<std::int64_t>(ms.size());
  Tensor all = Tensor::zeros({p, r}, DType::F64, Space::Host);
  if (r > 0) comm_.all_gather(ms.data(), all.raw(), r, DType::F64);
  const std::string path = "/timings/" + phase;
  if (!save_.keeps(path, all.numel()) || !writes()) return;
  auto [dir, name] = split_path(path);
  hid_t g = group(dir);
  hid_t ds = create_dataset(g, name, all.shape(), DType::F64, 0, path_, "dataset " + path);
  write_from_root(ds, DType::F64, all.raw(), io_ == H5Io::Collective, comm_.rank() == 0, path_, "dataset " + path);
  string_attr(ds, "units", "ms");
  string_attr(ds, "layout", "[rank, repeat]");
  H5Dclose(ds);
  H5Gclose(g);
}

void ResultsWriter::per_rank(const std::string& path, double v, const std::string& units) {
  const int p = comm_.size();
  std::vector<double> all(static_cast<std::size_t>(p));
  comm_.all_gather(&v, all.data(), 1, DType::F64);
  if (!save_.keeps(path, p) || !writes()) return;
  auto [dir, name] = split_path(path);
  hid_t g = group(dir);
  hid_t ds = create_dataset(g, name, {p}, DType::F64, 0, path_, "dataset " + path);
  write_from_root(ds, DType::F64, all.data(), io_ == H5Io::Collective, comm_.rank() == 0, path_, "dataset " + path);
  string_attr(ds, "units", units);
  string_attr(ds, "layout", "[rank]");
  H5Dclose(ds);
  H5Gclose(g);
}

void ResultsWriter::comm(const std::map<std::string, CommCounter>& counters, int steps, bool equal,
                         const std::string& prefix) {
  HCP_CHECK(steps > 0, "results: communication counters need at least one step");
  // Every rank must report the same op names: take the union by exchanging a fixed list.
  static const char* kOps[] = {"all_to_all", "all_to_all_v", "all_gather", "reduce_scatter", "all_reduce", "broadcast",
                               "send",       "recv",         "ring_post",  "ring_wait",      "barrier"};
  const int p = comm_.size();
  const double all_equal = comm_.all_reduce_scalar(equal ? 0.0 : 1.0, ReduceOp::Max) == 0 ? 1 : 0;
  for (const char* op : kOps) {
    auto it = counters.find(op);
    CommCounter cc = it == counters.end() ? CommCounter{} : it->second;
    double any = comm_.all_reduce_scalar(static_cast<double>(cc.calls), ReduceOp::Max);
    if (any == 0) continue;
    const std::int64_t mine[2] = {cc.bytes_sent / steps, cc.calls / steps};
    std::vector<std::int64_t> ints(2 * static_cast<std::size_t>(p));
    comm_.all_gather(mine, ints.data(), 2, DType::F64);  // 8-byte items, exchanged as they are
    std::vector<double> secs(static_cast<std::size_t>(p));
    const double s1 = cc.seconds / steps;
    comm_.all_gather(&s1, secs.data(), 1, DType::F64);
    std::vector<std::int64_t> bytes, calls;
    for (int r = 0; r < p; ++r) {
      bytes.push_back(ints[2 * static_cast<std::size_t>(r)]);
      calls.push_back(ints[2 * static_cast<std::size_t>(r) + 1]);
    }
    const std::string base = "/comm/" + prefix + op;
    if (!save_.keeps(base, p) || !writes()) continue;
    hid_t g = group(base);
    const auto put_int = [&](const char* n, const std::vector<std::int64_t>& v) {
      const std::string what = "dataset " + base + "/" + n;
      const hsize_t dim = static_cast<hsize_t>(p);
      hid_t space = HCP_H5_CHECK(H5Screate_simple(1, &dim, nullptr));
      hid_t ds =
          HCP_H5_WRITE(H5Dcreate2(g, n, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), path_, what);
      hid_t fs = HCP_H5_CHECK(H5Dget_space(ds));
      hid_t ms = HCP_H5_CHECK(H5Scopy(fs));
      hid_t dxpl = HCP_H5_CHECK(H5Pcreate(H5P_DATASET_XFER));
#ifdef H5_HAVE_PARALLEL
      if (io_ == H5Io::Collective) HCP_H5_CHECK(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
#endif
      const bool root = comm_.rank() == 0;
      if (!root) H5Sselect_none(fs), H5Sselect_none(ms);
      HCP_H5_WRITE(H5Dwrite(ds, H5T_NATIVE_INT64, ms, fs, dxpl, root ? v.data() : nullptr), path_, what);
      H5Pclose(dxpl);
      H5Sclose(ms);
      H5Sclose(fs);
      H5Dclose(ds);
      H5Sclose(space);
    };
    put_int("bytes_sent", bytes);
    put_int("calls", calls);
    {
      const std::string what = "dataset " + base + "/seconds";
      hid_t ds = create_dataset(g, "seconds", {p}, DType::F64, 0, path_, what);
      write_from_root(ds, DType::F64, secs.data(), io_ == H5Io::Collective, comm_.rank() == 0, path_, what);
      H5Dclose(ds);
    }
    string_attr(g, "layout", "[rank]");
    string_attr(g, "units", "bytes_sent: bytes per step, seconds: s per step, calls: count per step");
    string_attr(g, "per", "timed step: the sum over the timed steps divided by their number");
    double_attr(g, "steps", static_cast<double>(steps));
    double_attr(g, "steps_equal", all_equal);
    // What the counters count: the payload each rank hands to the communicator per call (for a
    // collective, the bytes that leave this rank in its logical exchange; an all-reduce counts as a
    // ring's 2 (n-1)/n of the buffer), not bytes on the wire (no protocol headers, no relaying by
    // NCCL rings or trees, no host staging).
    string_attr(g, "bytes_sent",
                "logical payload sent by this rank (all_reduce: 2(n-1)/n of the buffer), not wire bytes");
    H5Gclose(g);
  }
}

void ResultsWriter::summary(const std::string& name, double max_abs, double max_rel, double tol, bool pass) {
  double v[4] = {max_abs, max_rel, tol, pass ? 1.0 : 0.0};
  bcast(v, 4);
  if (!save_.keeps_class("summary") || !writes()) return;
  hid_t g = group("/summary/" + name);
  double_attr(g, "max_abs", v[0]);
  double_attr(g, "max_rel", v[1]);
  double_attr(g, "tolerance", v[2]);
  double_attr(g, "pass", v[3]);
  H5Gclose(g);
}

void ResultsWriter::summaries(const std::string& prefix, const std::vector<std::pair<std::string, double>>& rel,
                              double tol) {
  // Rank 0's list, as "name\tvalue" lines with exact (hex) values, on every rank.
  std::string text;
  if (comm_.rank() == 0)
    for (const auto& [n, v] : rel) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%a", v);
      text += n + "\t" + buf + "\n";
    }
  bcast(text);
  if (!writes()) return;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t tab = text.find('\t', at), nl = text.find('\n', tab);
    const double v = std::strtod(text.substr(tab + 1, nl - tab - 1).c_str(), nullptr);
    summary(prefix + "/" + text.substr(at, tab - at), v, v, tol, v <= tol);
    at = nl + 1;
  }
}

void ResultsWriter::finish() {
  double ok = 1;
  std::string why;
  if (writes()) {
    open();  // a run that wrote nothing still leaves a (nearly empty) file
    errno = 0;
    if (H5Fclose(file_) < 0) ok = 0, why = h5_reason(path_);
    file_ = -1;
  }
  if (io_ == H5Io::Collective) ok = comm_.all_reduce_scalar(ok, ReduceOp::Max) == 1 && ok == 1 ? 1 : 0;
  if (comm_.rank() == 0) {
    if (ok == 1) {
      try {
        write_manifest(tmp_, path_);
      } catch (const Error& e) {
        ok = 0, why = e.what();
      }
    }
    if (ok == 1 && std::rename(tmp_.c_str(), path_.c_str()) != 0) ok = 0, why = std::strerror(errno);
    unguard_tmp();
  }
  comm_.broadcast(&ok, 1, DType::F64, 0);
  unguard_tmp();  // the other ranks' handlers (rank 0's went after the rename)
  if (ok != 1) {
    if (comm_.rank() == 0) std::remove(tmp_.c_str());
    throw Error(detail::concat("could not complete results file '", path_, "'",
                               why.empty() ? std::string(" (see rank 0)") : ": " + why));
  }
  done_ = true;
}

}  // namespace hcp
