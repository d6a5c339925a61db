// Run output helpers: fixed-width tables printed by rank 0, "k=v" header fields and number formats.
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace hcp::drivers {

// "0,10,20" for /config.
std::string join(const std::vector<std::int64_t>& v);
std::string join(const std::vector<std::string>& v);

// A table of fixed-width columns printed by rank 0: the header line starts with "# ", rows with "  ".
class Table {
 public:
  explicit Table(std::vector<std::pair<std::string, int>> columns);
  void row(const std::vector<std::string>& cells);
  void print() const;

 private:
  std::vector<std::pair<std::string, int>> cols_;
  std::vector<std::vector<std::string>> rows_;
};
std::string fmt(const char* f, double v);
// "k1=v1 k2=v2 ..." for run headers: fields("tokens", 760, "heads", 8). A key ending in ':' is
// printed as it stands and its value after a space.
inline void fields_to(std::string&) {}
template <class V, class... R>
void fields_to(std::string& s, const std::string& k, const V& v, const R&... rest) {
  std::string val;
  if constexpr (std::is_convertible_v<V, std::string>)
    val = v;
  else
    val = std::to_string(v);
  s += (s.empty() ? "" : " ") + k + (!k.empty() && k.back() == ':' ? " " : "=") + val;
  fields_to(s, rest...);
}
template <class... A>
std::string fields(const A&... a) {
  std::string s;
  fields_to(s, a...);
  return s;
}
std::string fmt_int(std::int64_t v);

}  // namespace hcp::drivers
