// Run output helpers: tables, joined lists and number formats.
#include "table.hpp"

#include <cstdio>

namespace hcp::drivers {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) {
    if (!s.empty()) s += ',';
    s += x;
  }
  return s;
}
std::string join(const std::vector<std::int64_t>& v) {
  std::vector<std::string> t;
  for (auto x : v) t.push_back(std::to_string(x));
  return join(t);
}

Table::Table(std::vector<std::pair<std::string, int>> columns) : cols_(std::move(columns)) {}
void Table::row(const std::vector<std::string>& cells) { rows_.push_back(cells); }
void Table::print() const {
  const auto line = [&](const std::vector<std::string>& cells, const char* lead) {
    std::string s = lead;
    for (std::size_t i = 0; i < cols_.size(); ++i) {
      const int w = cols_[i].second;
      const std::string& c = i < cells.size() ? cells[i] : std::string("-");
      char b[256];
      std::snprintf(b, sizeof b, i == 0 ? "%-*s" : " %*s", w, c.c_str());
      s += b;
    }
    std::printf("%s\n", s.c_str());
  };
  std::vector<std::string> head;
  for (const auto& [n, w] : cols_) head.push_back(n);
  line(head, "# ");
  for (const auto& r : rows_) line(r, "  ");
}
std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
std::string fmt_int(std::int64_t v) { return std::to_string(v); }

}  // namespace hcp::drivers
