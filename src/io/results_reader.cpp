// Reading results files back (single process), and the checksum checkpoints carry.
#include <hdf5.h>

#include <cstdio>
#include <cstring>

#include "io/results.hpp"

namespace hcp {
namespace {
hid_t h5_type(DType dt) { return dt == DType::F64 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT; }
}  // namespace

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
