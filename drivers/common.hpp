// Helpers shared by the drivers: timing statistics, comparisons, sequence-length lists.
#pragma once
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace hcp::drivers {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// "100, 37,5" -> {100, 37, 5}; every entry a positive integer.
inline std::vector<std::int64_t> parse_lengths(const std::string& s, const std::string& key) {
  std::vector<std::int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    std::size_t pos = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    HCP_CHECK(pos == item.size() && v > 0, "key '", key, "': '", item, "' is not a positive integer length");
    out.push_back(v);
  }
  HCP_CHECK(!out.empty(), "key '", key, "' must list at least one sequence length");
  return out;
}

}  // namespace hcp::drivers
