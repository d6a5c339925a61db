// /checksums, the manifest that makes a finished results file verifiable. Rank 0 writes it into the
// closed file before the rename; hcp_post.py recomputes every line and calls a file that differs
// damaged.
#include <hdf5.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "io/manifest.hpp"

#include "io/h5_util.hpp"
#include "io/results_reader.hpp"

namespace hcp {
namespace {

struct ManifestScan {
  std::vector<std::string> datasets, objects;  // objects: every group and dataset, "/" first
};
extern "C" herr_t manifest_visit(hid_t grp, const char* name, const H5L_info_t*, void* data) {
  auto* scan = static_cast<ManifestScan*>(data);
  const std::string n = std::string("/") + name;
  hid_t o = H5Oopen(grp, name, H5P_DEFAULT);
  if (o < 0) return -1;
  const H5I_type_t t = H5Iget_type(o);
  H5Oclose(o);
  if (n == "/checksums") return 0;
  scan->objects.push_back(n);
  if (t == H5I_DATASET) scan->datasets.push_back(n);
  return 0;
}
bool numeric(hid_t type) {
  const H5T_class_t c = H5Tget_class(type);
  return c == H5T_INTEGER || c == H5T_FLOAT;
}
std::uint64_t dataset_sum(hid_t f, const std::string& path, const std::string& file) {
  hid_t ds = HCP_H5_CHECK(H5Dopen2(f, path.c_str(), H5P_DEFAULT));
  hid_t fs = HCP_H5_CHECK(H5Dget_space(ds));
  const int nd = H5Sget_simple_extent_ndims(fs);
  std::vector<hsize_t> dims(static_cast<std::size_t>(std::max(nd, 0)));
  if (nd > 0) H5Sget_simple_extent_dims(fs, dims.data(), nullptr);
  const hsize_t rows = nd > 0 ? dims[0] : 1;
  hsize_t row_len = 1;
  for (int i = 1; i < nd; ++i) row_len *= dims[static_cast<std::size_t>(i)];
  const hsize_t block = std::max<hsize_t>(1, (hsize_t{1} << 20) / std::max<hsize_t>(row_len, 1));
  std::uint64_t acc = 0;
  std::vector<double> buf;
  for (hsize_t r0 = 0; r0 < rows; r0 += block) {
    const hsize_t nr = std::min(block, rows - r0), n = nr * row_len;
    buf.resize(static_cast<std::size_t>(n));
    hid_t ms = HCP_H5_CHECK(H5Screate_simple(1, &n, nullptr));
    if (nd > 0) {
      std::vector<hsize_t> start(dims.size(), 0), count = dims;
      start[0] = r0;
      count[0] = nr;
      HCP_H5_CHECK(H5Sselect_hyperslab(fs, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr));
    }
    if (n > 0) HCP_H5_WRITE(H5Dread(ds, H5T_NATIVE_DOUBLE, ms, fs, H5P_DEFAULT, buf.data()), file, "dataset " + path);
    H5Sclose(ms);
    acc += checksum_values(buf.data(), buf.size(), static_cast<std::uint64_t>(r0 * row_len));
  }
  H5Sclose(fs);
  H5Dclose(ds);
  return acc;
}
extern "C" herr_t manifest_attr(hid_t obj, const char* name, const H5A_info_t*, void* data) {
  auto* out = static_cast<std::vector<std::pair<std::string, std::uint64_t>>*>(data);
  hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) return -1;
  hid_t t = H5Aget_type(a);
  if (numeric(t)) {
    hid_t sp = H5Aget_space(a);
    const auto n = static_cast<std::size_t>(H5Sget_simple_extent_npoints(sp));
    std::vector<double> v(n);
    const herr_t rc = n > 0 ? H5Aread(a, H5T_NATIVE_DOUBLE, v.data()) : 0;
    H5Sclose(sp);
    if (rc < 0) {
      H5Tclose(t);
      H5Aclose(a);
      return -1;
    }
    out->emplace_back(name, checksum_values(v.data(), n, 0));
  }
  H5Tclose(t);
  H5Aclose(a);
  return 0;
}
}  // namespace

void write_manifest(const std::string& tmp, const std::string& shown) {
  hid_t f = H5Fopen(tmp.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  HCP_CHECK(f >= 0, "cannot reopen results file '", shown, "' to write its checksums: ", h5_reason());
  ManifestScan scan;
  std::string text;
  try {
    scan.objects.push_back("/");
    HCP_H5_CHECK(H5Lvisit(f, H5_INDEX_NAME, H5_ITER_INC, manifest_visit, &scan));
    for (const auto& d : scan.datasets) text += d + " " + checksum_hex(dataset_sum(f, d, shown)) + "\n";
    // Every numeric attribute of every object (/config's cp_size, world_size, tokens; /memory's
    // bytes; /summary's errors): post-processing reads no number that this manifest does not cover.
    for (const auto& o : scan.objects) {
      std::vector<std::pair<std::string, std::uint64_t>> attrs;
      hsize_t idx = 0;
      HCP_H5_CHECK(
          H5Aiterate_by_name(f, o.c_str(), H5_INDEX_NAME, H5_ITER_INC, &idx, manifest_attr, &attrs, H5P_DEFAULT));
      for (const auto& [n, v] : attrs) text += o + "@" + n + " " + checksum_hex(v) + "\n";
    }
    const hsize_t len = std::max<hsize_t>(text.size(), 1);
    hid_t sp = HCP_H5_CHECK(H5Screate_simple(1, &len, nullptr));
    hid_t ds = HCP_H5_WRITE(H5Dcreate2(f, "checksums", H5T_NATIVE_UINT8, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                            shown, "dataset /checksums");
    text.resize(static_cast<std::size_t>(len), '\n');
    HCP_H5_WRITE(H5Dwrite(ds, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, text.data()), shown,
                 "dataset /checksums");
    H5Dclose(ds);
    H5Sclose(sp);
  } catch (...) {
    H5Fclose(f);
    throw;
  }
  errno = 0;
  HCP_CHECK(H5Fclose(f) >= 0, "cannot close results file '", shown, "' after its checksums: ", h5_reason(shown));
}

}  // namespace hcp
