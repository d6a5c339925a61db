#include "io/results.hpp"

#include <hdf5.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace hcp {
namespace {

hid_t h5_type(DType dt) { return dt == DType::F64 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT; }

// The reason the last HDF5 call failed, as the system said it: HDF5's file driver records the errno
// of a failed write in its error stack ("errno = 28, error message = 'No space left on device'").
herr_t find_errno(unsigned, const H5E_error2_t* e, void* out) {
  const char* at = e->desc ? std::strstr(e->desc, "errno = ") : nullptr;
  if (at != nullptr && *static_cast<int*>(out) == 0) *static_cast<int*>(out) = std::atoi(at + 8);
  return 0;
}
std::string h5_reason() {
  int code = 0;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, find_errno, &code);
  if (code == 0) code = errno;
  return code != 0 ? std::strerror(code) : "the HDF5 library refused the call";
}

// Checks an HDF5 call made while writing `what` to `file`; a failure names both and the reason.
#define HCP_H5_WRITE(call, file, what)                                                                    \
  ([&]() {                                                                                                \
    errno = 0;                                                                                            \
    auto hcp_rc_ = (call);                                                                                \
    if (hcp_rc_ < 0)                                                                                      \
      throw ::hcp::Error(::hcp::detail::concat("cannot write ", what, " to results file '", file, "': ",   \
                                               h5_reason()));                                             \
    return hcp_rc_;                                                                                       \
  }())

void write_dataset(hid_t loc, const std::string& name, const Tensor& t, const std::string& file,
                   const std::string& what) {
  // Device tensors are copied to the host; bf16 is widened to fp32; strided views are made contiguous.
  Tensor c = t.space() == Space::Cuda ? t.to(Space::Host) : t;
  if (c.dtype() == DType::BF16) c = c.to(DType::F32);
  else if (!c.is_contiguous()) c = c.clone();
  std::vector<hsize_t> dims;
  for (auto d : c.shape()) dims.push_back(static_cast<hsize_t>(d));
  if (dims.empty()) dims.push_back(1);
  hid_t space = HCP_H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  hid_t ds = HCP_H5_WRITE(
      H5Dcreate2(loc, name.c_str(), h5_type(c.dtype()), space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), file, what);
  H5Sclose(space);
  HCP_H5_WRITE(H5Dwrite(ds, h5_type(c.dtype()), H5S_ALL, H5S_ALL, H5P_DEFAULT, c.raw()), file, what);
  H5Dclose(ds);
}

std::pair<std::string, std::string> split_path(const std::string& p) {
  auto pos = p.rfind('/');
  if (pos == std::string::npos) return {"/", p};
  return {pos == 0 ? "/" : p.substr(0, pos), p.substr(pos + 1)};
}

// The unfinished results file of this process, removed when SIGTERM or SIGINT ends it (a SIGKILL
// cannot be caught: a `.tmp-<pid>` that remains is an unfinished file, and hcp_post refuses it).
char g_tmp_path[4096] = {0};
struct sigaction g_old_term, g_old_int;

extern "C" void remove_tmp_and_reraise(int sig) {
  if (g_tmp_path[0]) unlink(g_tmp_path);  // async-signal-safe
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}
void guard_tmp(const std::string& path) {
  if (path.size() >= sizeof(g_tmp_path)) return;
  std::memcpy(g_tmp_path, path.c_str(), path.size() + 1);
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
}

}  // namespace

// The output folder was checked before any work (run_driver); the file itself is created when the
// first result is written, so that a run which fails or is killed before then leaves nothing.
ResultsWriter::ResultsWriter(const std::string& path, Communicator& comm) : comm_(comm), path_(path) {}

ResultsWriter::~ResultsWriter() {
  if (file_ >= 0) H5Fclose(file_);
  if (!done_ && !tmp_.empty()) std::remove(tmp_.c_str());
  if (!tmp_.empty()) unguard_tmp();
}

void ResultsWriter::open() {
  if (file_ >= 0) return;
  tmp_ = path_ + ".tmp-" + std::to_string(getpid());
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  errno = 0;
  file_ = H5Fcreate(tmp_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file_ < 0) {
    const std::string why = h5_reason();
    tmp_.clear();
    throw Error(detail::concat("cannot create results file '", path_, "': ", why));
  }
  guard_tmp(tmp_);
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
  if (comm_.rank() != 0) return;
  hid_t o = HCP_H5_CHECK(H5Oopen(file_, path.c_str(), H5P_DEFAULT));
  string_attr(o, name, value);
  H5Oclose(o);
}

std::string checksum(const Tensor& t) {
  const Tensor h = t.space() == Space::Cuda ? t.to(Space::Host) : t;
  std::uint64_t acc = 0x243f6a8885a308d3ull ^ static_cast<std::uint64_t>(h.numel());
  for (std::int64_t i = 0; i < h.numel(); ++i) {
    const double v = h.get(i);
    std::uint64_t b = 0;
    std::memcpy(&b, &v, sizeof b);
    acc = (acc ^ b) * 0x100000001b3ull;  // FNV-1a step over 64-bit words
    acc ^= acc >> 29;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(acc));
  return buf;
}

void ResultsWriter::string_attr(long long obj, const std::string& name, const std::string& v) {
  hid_t type = HCP_H5_CHECK(H5Tcopy(H5T_C_S1));
  HCP_H5_CHECK(H5Tset_size(type, H5T_VARIABLE));
  HCP_H5_CHECK(H5Tset_cset(type, H5T_CSET_UTF8));
  hid_t space = HCP_H5_CHECK(H5Screate(H5S_SCALAR));
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  hid_t a = HCP_H5_WRITE(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), path_,
                         "attribute " + name);
  const char* s = v.c_str();
  HCP_H5_WRITE(H5Awrite(a, type, &s), path_, "attribute " + name);
  H5Aclose(a);
  H5Sclose(space);
  H5Tclose(type);
}

void ResultsWriter::double_attr(long long obj, const std::string& name, double v) {
  hid_t space = HCP_H5_CHECK(H5Screate(H5S_SCALAR));
  if (H5Aexists(obj, name.c_str()) > 0) H5Adelete(obj, name.c_str());
  hid_t a = HCP_H5_WRITE(H5Acreate2(obj, name.c_str(), H5T_NATIVE_DOUBLE, space, H5P_DEFAULT, H5P_DEFAULT),
                         path_, "attribute " + name);
  HCP_H5_WRITE(H5Awrite(a, H5T_NATIVE_DOUBLE, &v), path_, "attribute " + name);
  H5Aclose(a);
  H5Sclose(space);
}

void ResultsWriter::config(const std::map<std::string, std::string>& attrs) {
  if (comm_.rank() != 0) return;
  hid_t g = group("/config");
  for (auto& [k, v] : attrs) string_attr(g, k, v);
  H5Gclose(g);
}

void ResultsWriter::config_int(const std::string& name, std::int64_t v) {
  if (comm_.rank() != 0) return;
  hid_t g = group("/config");
  double_attr(g, name, static_cast<double>(v));
  H5Gclose(g);
}

void ResultsWriter::tensor(const std::string& path, const Tensor& t, const std::string& layout,
                           const std::string& units) {
  if (comm_.rank() != 0) return;
  auto [dir, name] = split_path(path);
  hid_t g = group(dir);
  write_dataset(g, name, t, path_, "dataset " + path);
  hid_t ds = HCP_H5_CHECK(H5Dopen2(g, name.c_str(), H5P_DEFAULT));
  string_attr(ds, "layout", layout);
  string_attr(ds, "units", units);
  string_attr(ds, "dtype", to_string(t.dtype()));
  H5Dclose(ds);
  H5Gclose(g);
}

void ResultsWriter::timings(const std::string& phase, const std::vector<double>& ms) {
  const int p = comm_.size();
  std::vector<double> nrep = comm_.gather_to_root(static_cast<double>(ms.size()));
  for (double n : nrep)
    HCP_CHECK(n == static_cast<double>(ms.size()), "timings('", phase, "'): ranks recorded different repeat counts");
  const auto r = static_cast<std::int64_t>(ms.size());
  Tensor all = Tensor::zeros({p, r}, DType::F64, Space::Host);
  if (r > 0) comm_.all_gather(ms.data(), all.raw(), r, DType::F64);
  if (comm_.rank() != 0) return;
  auto [dir, name] = split_path("/timings/" + phase);
  hid_t g = group(dir);
  write_dataset(g, name, all, path_, "dataset /timings/" + phase);
  hid_t ds = HCP_H5_CHECK(H5Dopen2(g, name.c_str(), H5P_DEFAULT));
  string_attr(ds, "units", "ms");
  string_attr(ds, "layout", "[rank, repeat]");
  H5Dclose(ds);
  H5Gclose(g);
}

void ResultsWriter::comm(const Communicator& c, const std::string& prefix) {
  // Every rank must report the same op names: take the union by exchanging a fixed list.
  static const char* kOps[] = {"all_to_all", "all_to_all_v", "all_gather", "reduce_scatter", "all_reduce",
                               "broadcast",  "send",         "recv",       "ring_post",      "ring_wait",
                               "barrier"};
  for (const char* op : kOps) {
    auto it = c.counters().find(op);
    CommCounter cc = it == c.counters().end() ? CommCounter{} : it->second;
    double any = comm_.all_reduce_scalar(static_cast<double>(cc.calls), ReduceOp::Max);
    if (any == 0) continue;
    auto bytes = comm_.gather_to_root(static_cast<double>(cc.bytes_sent));
    auto secs = comm_.gather_to_root(cc.seconds);
    auto calls = comm_.gather_to_root(static_cast<double>(cc.calls));
    if (comm_.rank() != 0) continue;
    const auto p = static_cast<std::int64_t>(bytes.size());
    const std::string base = "/comm/" + prefix + op;
    hid_t g = group(base);
    write_dataset(g, "bytes_sent", Tensor::wrap(bytes.data(), {p}, DType::F64), path_, "dataset " + base + "/bytes_sent");
    write_dataset(g, "seconds", Tensor::wrap(secs.data(), {p}, DType::F64), path_, "dataset " + base + "/seconds");
    write_dataset(g, "calls", Tensor::wrap(calls.data(), {p}, DType::F64), path_, "dataset " + base + "/calls");
    string_attr(g, "layout", "[rank]");
    string_attr(g, "units", "bytes_sent: bytes, seconds: s, calls: count");
    // What the counters count: the payload each rank hands to the communicator per call (for a
    // collective, the bytes that leave this rank in its logical exchange; an all-reduce counts as a
    // ring's 2 (n-1)/n of the buffer), not bytes on the wire (no protocol headers, no relaying by
    // NCCL rings or trees, no host staging).
    string_attr(g, "bytes_sent", "logical payload sent by this rank (all_reduce: 2(n-1)/n of the buffer), not wire bytes");
    H5Gclose(g);
  }
}

void ResultsWriter::summary(const std::string& name, double max_abs, double max_rel, double tol, bool pass) {
  if (comm_.rank() != 0) return;
  hid_t g = group("/summary/" + name);
  double_attr(g, "max_abs", max_abs);
  double_attr(g, "max_rel", max_rel);
  double_attr(g, "tolerance", tol);
  double_attr(g, "pass", pass ? 1.0 : 0.0);
  H5Gclose(g);
}

void ResultsWriter::finish() {
  double ok = 1;
  std::string why;
  if (comm_.rank() == 0) {
    open();  // a run that wrote nothing still leaves a (nearly empty) file
    errno = 0;
    if (H5Fclose(file_) < 0) ok = 0, why = h5_reason();
    file_ = -1;
    if (ok == 1 && std::rename(tmp_.c_str(), path_.c_str()) != 0) ok = 0, why = std::strerror(errno);
    unguard_tmp();
  }
  comm_.broadcast(&ok, 1, DType::F64, 0);
  if (ok != 1) {
    if (comm_.rank() == 0) std::remove(tmp_.c_str());
    throw Error(detail::concat("could not complete results file '", path_, "'",
                               why.empty() ? std::string(" (see rank 0)") : ": " + why));
  }
  done_ = true;
}

// ---- reader ------------------------------------------------------------------------------------
ResultsReader::ResultsReader(const std::string& path) : path_(path) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  HCP_CHECK(file_ >= 0, "cannot open HDF5 file '", path, "' for reading");
}
ResultsReader::~ResultsReader() {
  if (file_ >= 0) H5Fclose(file_);
}

bool ResultsReader::exists(const std::string& path) const {
  // Check every prefix so a missing group does not raise.
  std::size_t pos = 1;
  while (true) {
    auto end = path.find('/', pos);
    std::string pre = path.substr(0, end);
    if (H5Lexists(file_, pre.c_str(), H5P_DEFAULT) <= 0) return false;
    if (end == std::string::npos) return true;
    pos = end + 1;
  }
}

Tensor ResultsReader::read(const std::string& path, DType dt) const {
  HCP_CHECK(exists(path), path_, ": no dataset '", path, "'");
  hid_t ds = HCP_H5_CHECK(H5Dopen2(file_, path.c_str(), H5P_DEFAULT));
  hid_t space = HCP_H5_CHECK(H5Dget_space(ds));
  int nd = HCP_H5_CHECK(H5Sget_simple_extent_ndims(space));
  std::vector<hsize_t> dims(static_cast<std::size_t>(nd));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  Shape shape(dims.begin(), dims.end());
  DType rd = dt == DType::BF16 ? DType::F32 : dt;
  Tensor t = Tensor::empty(shape, rd, Space::Host);
  HCP_H5_CHECK(H5Dread(ds, h5_type(rd), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.raw()));
  H5Sclose(space);
  H5Dclose(ds);
  return dt == rd ? t : t.to(dt);
}

std::string ResultsReader::string_attr(const std::string& obj, const std::string& name) const {
  HCP_CHECK(exists(obj) || obj == "/", path_, ": no object '", obj, "'");
  hid_t a = H5Aopen_by_name(file_, obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
  HCP_CHECK(a >= 0, path_, ": no attribute '", name, "' on '", obj, "'");
  hid_t type = HCP_H5_CHECK(H5Tcopy(H5T_C_S1));
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  char* s = nullptr;
  HCP_H5_CHECK(H5Aread(a, type, &s));
  std::string out = s ? s : "";
  H5free_memory(s);
  H5Tclose(type);
  H5Aclose(a);
  return out;
}

double ResultsReader::double_attr(const std::string& obj, const std::string& name) const {
  hid_t a = H5Aopen_by_name(file_, obj.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
  HCP_CHECK(a >= 0, path_, ": no attribute '", name, "' on '", obj, "'");
  double v = 0;
  HCP_H5_CHECK(H5Aread(a, H5T_NATIVE_DOUBLE, &v));
  H5Aclose(a);
  return v;
}

}  // namespace hcp
