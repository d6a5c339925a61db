// Reading results files back (single process), and the checksum checkpoints carry.
#include <hdf5.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "io/results_reader.hpp"

namespace hcp {
namespace {
hid_t h5_type(DType dt) { return dt == DType::F64 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT; }
}  // namespace

std::uint64_t checksum_values(const double* v, std::size_t n, std::uint64_t first) {
  std::uint64_t acc = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t b = 0;
    std::memcpy(&b, &v[i], sizeof b);
    acc += mix64(b ^ mix64(first + i));  // each value keyed by its index
  }
  return acc;
}

std::uint64_t checksum_part(const Tensor& t, std::int64_t first) {
  const Tensor h = t.space() == Space::Cuda ? t.to(Space::Host) : t;
  std::vector<double> v(static_cast<std::size_t>(h.numel()));
  for (std::int64_t i = 0; i < h.numel(); ++i) v[static_cast<std::size_t>(i)] = h.get(i);
  return checksum_values(v.data(), v.size(), static_cast<std::uint64_t>(first));
}

std::string checksum_hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string checksum(const Tensor& t) { return checksum_hex(checksum_part(t, 0)); }

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

Tensor ResultsReader::read_rows(const std::string& path, std::int64_t first, std::int64_t rows, DType dt) const {
  HCP_CHECK(exists(path), path_, ": no dataset '", path, "'");
  hid_t ds = HCP_H5_CHECK(H5Dopen2(file_, path.c_str(), H5P_DEFAULT));
  hid_t space = HCP_H5_CHECK(H5Dget_space(ds));
  const int nd = HCP_H5_CHECK(H5Sget_simple_extent_ndims(space));
  std::vector<hsize_t> dims(static_cast<std::size_t>(nd));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  const bool ok = nd >= 1 && first >= 0 && rows >= 0 && static_cast<hsize_t>(first + rows) <= dims[0];
  if (!ok) {
    H5Sclose(space);
    H5Dclose(ds);
    HCP_FAIL(path_, ": rows [", first, ", ", first + rows, ") of '", path, "' outside its ", nd ? dims[0] : 0, " rows");
  }
  std::vector<hsize_t> start(dims.size(), 0), count = dims;
  start[0] = static_cast<hsize_t>(first);
  count[0] = static_cast<hsize_t>(rows);
  H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  hid_t mem = HCP_H5_CHECK(H5Screate_simple(nd, count.data(), nullptr));
  const DType rd = dt == DType::BF16 ? DType::F32 : dt;
  Tensor t = Tensor::empty(Shape(count.begin(), count.end()), rd, Space::Host);
  const herr_t st = rows > 0 ? H5Dread(ds, h5_type(rd), mem, space, H5P_DEFAULT, t.raw()) : 0;
  H5Sclose(mem);
  H5Sclose(space);
  H5Dclose(ds);
  HCP_CHECK(st >= 0, path_, ": cannot read rows of '", path, "'");
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
