// What a results file keeps (run.save) and how it is written (HDF5 with or without MPI-IO).
#include <hdf5.h>

#include <algorithm>
#include <cctype>

#include "io/save.hpp"

#include "core/error.hpp"

namespace hcp {

bool hdf5_parallel() {
#ifdef H5_HAVE_PARALLEL
  return true;
#else
  return false;
#endif
}

std::string to_string(H5Io io) {
  return io == H5Io::Collective ? "collective: parallel HDF5, every rank writes its own rows of each tensor"
                                : "gather: rank 0 receives each tensor whole and writes it";
}

// ---- what a run keeps --------------------------------------------------------------------------
namespace {
// The classes run.save chooses among; every other top-level group (/config, /train, ...) is kept.
// "inputs" (what a run starts from) is kept by "all" and by name, not by "auto".
const char* const kClasses[] = {"activations", "gradients", "timings", "comm", "memory", "summary", "inputs"};
bool is_class(const std::string& s) {
  return std::find(std::begin(kClasses), std::end(kClasses), s) != std::end(kClasses);
}
// The class of a dataset path: its first component; /stats belongs to the summary.
std::string class_of(const std::string& path) {
  const std::string first = path.substr(1, path.find('/', 1) - 1);
  return first == "stats" ? "summary" : first;
}
}  // namespace

SaveSet::SaveSet(const std::string& list) : text_(list) {
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t end = std::min(list.find(',', start), list.size());
    std::string item = list.substr(start, end - start);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    while (!item.empty() && item.front() == '/') item.erase(0, 1);
    while (!item.empty() && item.back() == '/') item.pop_back();
    // No source location: the caller names the deck key and line.
    if (item.empty())
      throw Error(detail::concat("\"", list,
                                 "\" has an empty item (items: all, auto, activations, gradients, timings, ",
                                 "comm, memory, summary, inputs, or tensor names, separated by commas)"));
    for (char ch : item)
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '/' && ch != '-' && ch != '.')
        throw Error(
            detail::concat("item '", item, "': a tensor name holds letters, digits, '_', '-', '.' and '/' only"));
    items_.push_back(item);
    start = end + 1;
  }
}

bool SaveSet::keeps_class(const std::string& cls) const {
  for (const auto& it : items_)
    if (it == "all" || (it == "auto" && cls != "inputs") || it == cls) return true;
  return false;
}

namespace {
// A tensor-name item names `path`: a path below the root, or the path's last components.
bool names(const std::string& item, const std::string& path) {
  const std::string slash = "/" + item;
  if (path == slash || path.rfind(slash + "/", 0) == 0) return true;
  return path.size() > slash.size() && path.compare(path.size() - slash.size(), slash.size(), slash) == 0;
}
}  // namespace

bool SaveSet::keeps(const std::string& path, std::int64_t numel) const {
  const std::string cls = class_of(path);
  if (!is_class(cls)) return true;
  for (const auto& it : items_) {
    if (it == "all" || it == cls) return true;
    if (it == "auto" && cls != "inputs" && numel <= kAutoMaxElements) return true;
    if (it == "auto" || is_class(it)) continue;
    if (names(it, path)) return true;
  }
  return false;
}

std::string SaveSet::unmatched(const std::vector<std::string>& tensors) const {
  for (const auto& it : items_) {
    if (it == "all" || it == "auto" || is_class(it)) continue;
    const std::string first = it.substr(0, it.find('/'));
    // Below /timings, /comm, /memory, /summary: names a run makes as it goes (phases, ops).
    if (it.find('/') != std::string::npos && is_class(first) && first != "activations" && first != "gradients")
      continue;
    if (std::none_of(tensors.begin(), tensors.end(), [&](const std::string& p) { return names(it, p); })) return it;
  }
  return "";
}

}  // namespace hcp
