// The lookups of a record list (the attention and Mamba CP strategies' registries): a record by id or
// by its deck name, and the names and ids in list order. A record type has members `id` and `name`.
#pragma once
#include <string>
#include <vector>

#include "core/error.hpp"

namespace hcp {

// "a, b or c", for messages that list the choices.
inline std::string choice_list(const std::vector<std::string>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? (i + 1 == v.size() ? " or " : ", ") : "") + v[i];
  return s;
}

template <class R>
std::vector<std::string> record_names(const std::vector<R>& v) {
  std::vector<std::string> n;
  for (const R& r : v) n.emplace_back(r.name);
  return n;
}

template <class R>
auto record_ids(const std::vector<R>& v) {
  std::vector<decltype(R::id)> ids;
  for (const R& r : v) ids.push_back(r.id);
  return ids;
}

// `what` names the list in the error (e.g. "attention CP strategy").
template <class R>
const R& record_by_id(const std::vector<R>& v, decltype(R::id) id, const char* what) {
  for (const R& r : v)
    if (r.id == id) return r;
  HCP_FAIL(what, " ", static_cast<int>(id), " has no record");
}

template <class R>
const R& record_by_name(const std::vector<R>& v, const std::string& name, const char* what) {
  for (const R& r : v)
    if (name == r.name) return r;
  HCP_FAIL("unknown ", what, " '", name, "' (expected ", choice_list(record_names(v)), ")");
}

}  // namespace hcp
