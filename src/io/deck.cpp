#include "io/deck.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.hpp"

namespace hcp {
namespace {

const char* type_name(DeckKey::Type t) {
  switch (t) {
    case DeckKey::Type::Int:
      return "an integer";
    case DeckKey::Type::Float:
      return "a number";
    case DeckKey::Type::String:
      return "a string";
    case DeckKey::Type::Bool:
      return "a boolean";
  }
  return "?";
}

std::string fmt_value(const DeckValue& v) {
  std::ostringstream os;
  if (auto p = std::get_if<std::int64_t>(&v)) os << *p;
  if (auto p = std::get_if<double>(&v)) {
    os.precision(17);
    os << *p;
    if (os.str().find_first_of(".eEn") == std::string::npos) os << ".0";
  }
  if (auto p = std::get_if<std::string>(&v)) os << '"' << *p << '"';
  if (auto p = std::get_if<bool>(&v)) os << (*p ? "true" : "false");
  return os.str();
}

// Checks range and choices; `where` prefixes the message (file:line or --set).
void check_rules(const DeckKey& k, const DeckValue& v, const std::string& where) {
  double num = 0;
  bool numeric = false;
  if (auto p = std::get_if<std::int64_t>(&v)) num = static_cast<double>(*p), numeric = true;
  if (auto p = std::get_if<double>(&v)) num = *p, numeric = true;
  if (numeric) {
    // NaN fails every comparison below and inf passes a one-sided range: neither is a setting.
    if (!std::isfinite(num)) HCP_INPUT_FAIL(where, "key '", k.key, "' = ", fmt_value(v), " must be a finite number");
    if (k.min && num < *k.min)
      HCP_INPUT_FAIL(where, "key '", k.key, "' = ", fmt_value(v), " is out of range: must be >= ", *k.min);
    if (k.max && num > *k.max)
      HCP_INPUT_FAIL(where, "key '", k.key, "' = ", fmt_value(v), " is out of range: must be <= ", *k.max);
  }
  if (auto p = std::get_if<std::string>(&v); p && !k.choices.empty()) {
    // A list key with choices: each item is one of them.
    const std::vector<std::string> items = k.list ? list_items(*p) : std::vector<std::string>{*p};
    std::string all;
    for (auto& c : k.choices) all += (all.empty() ? "" : ", ") + c;
    for (const std::string& item : items) {
      const bool ok = std::find(k.choices.begin(), k.choices.end(), item) != k.choices.end();
      const std::string what = items.size() > 1 ? "' item \"" : "' = \"";
      if (!ok && k.renamed_choices.count(item))
        HCP_INPUT_FAIL(where, "key '", k.key, what, item, "\" is now \"", k.renamed_choices.at(item), "\"");
      if (!ok) HCP_INPUT_FAIL(where, "key '", k.key, what, item, "\" is not one of: ", all);
    }
  }
}

// The items of a list key, comma-joined; none may be empty or hold a comma.
std::string joined(const DeckKey& k, const std::vector<std::string>& items, const std::string& where) {
  HCP_INPUT_CHECK(!items.empty(), where, "key '", k.key, "' is an empty array");
  std::string out;
  for (const std::string& item : items) {
    HCP_INPUT_CHECK(!item.empty() && item.find(',') == std::string::npos, where, "key '", k.key, "': array item \"",
                    item, "\" is empty or holds a comma");
    out += (out.empty() ? "" : ",") + item;
  }
  return out;
}
// A TOML array of strings and integers.
std::string joined(const DeckKey& k, const toml::array& a, const std::string& where) {
  std::vector<std::string> items;
  for (const toml::node& e : a) {
    if (auto s = e.value_exact<std::string>())
      items.push_back(*s);
    else if (auto i = e.value_exact<std::int64_t>())
      items.push_back(std::to_string(*i));
    else
      HCP_INPUT_FAIL(where, "key '", k.key, "': array items must be strings or integers");
  }
  return joined(k, items, where);
}
// --set key=[a, "b", 3]: the items between the brackets, quotes optional (a shell eats them).
std::string joined(const DeckKey& k, const std::string& bracketed, const std::string& where) {
  const std::string inner = bracketed.substr(1, bracketed.size() - 2);
  if (inner.find_first_not_of(" \t") == std::string::npos) return joined(k, std::vector<std::string>{}, where);
  std::vector<std::string> items = list_items(inner);
  for (std::string& item : items) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.size() >= 2 && (item.front() == '"' || item.front() == '\'') && item.back() == item.front())
      item = item.substr(1, item.size() - 2);
  }
  return joined(k, items, where);
}

DeckValue from_node(const DeckKey& k, const toml::node& n, const std::string& where) {
  switch (k.type) {
    case DeckKey::Type::Int:
      if (auto v = n.value_exact<std::int64_t>()) return *v;
      break;
    case DeckKey::Type::Float:
      if (n.is_floating_point()) return *n.value<double>();
      if (auto v = n.value_exact<std::int64_t>()) return static_cast<double>(*v);
      break;
    case DeckKey::Type::String:
      if (auto v = n.value_exact<std::string>()) return *v;
      if (k.list && n.is_array()) return joined(k, *n.as_array(), where);
      break;
    case DeckKey::Type::Bool:
      if (auto v = n.value_exact<bool>()) return *v;
      break;
  }
  HCP_INPUT_FAIL(where, "key '", k.key, "' must be ", type_name(k.type),
                 k.list ? " or an array of strings or integers" : "");
}

DeckValue from_text(const DeckKey& k, const std::string& s, const std::string& where) {
  try {
    std::size_t pos = 0;
    switch (k.type) {
      case DeckKey::Type::Int: {
        long long v = std::stoll(s, &pos);
        if (pos == s.size()) return static_cast<std::int64_t>(v);
        break;
      }
      case DeckKey::Type::Float: {
        double v = std::stod(s, &pos);
        if (pos == s.size()) return v;
        break;
      }
      case DeckKey::Type::String: {
        std::string t = s;
        if (t.size() >= 2 && t.front() == '"' && t.back() == '"') t = t.substr(1, t.size() - 2);
        if (k.list && t.size() >= 2 && t.front() == '[' && t.back() == ']') return joined(k, t, where);
        return t;
      }
      case DeckKey::Type::Bool:
        if (s == "true" || s == "1") return true;
        if (s == "false" || s == "0") return false;
        break;
    }
  } catch (const std::out_of_range&) {
    HCP_INPUT_FAIL(where, "key '", k.key, "' = ", s, " is outside the range of ",
                   k.type == DeckKey::Type::Int ? "a 64-bit integer" : "a double (magnitude <= 1.8e308)");
  } catch (const std::invalid_argument&) {
  }
  HCP_INPUT_FAIL(where, "key '", k.key, "' must be ", type_name(k.type), ", got '", s, "'");
}

void walk(const toml::table& tbl, const std::string& prefix, const DeckSchema& schema, const std::string& source,
          std::map<std::string, DeckValue>& values, std::map<std::string, std::string>& where_set) {
  for (auto&& [name, node] : tbl) {
    std::string key = prefix.empty() ? std::string(name.str()) : prefix + "." + std::string(name.str());
    std::string where = source + ":" + std::to_string(node.source().begin.line);
    if (auto sub = node.as_table()) {
      walk(*sub, key, schema, source, values, where_set);
      continue;
    }
    const DeckKey* k = schema.find(key);
    if (!k && !schema.renamed(key).empty()) HCP_INPUT_FAIL(where, "key '", key, "' is now '", schema.renamed(key), "'");
    if (!k) HCP_INPUT_FAIL(where, "unknown key '", key, "' (see --help-deck for the keys this driver reads)");
    DeckValue v = from_node(*k, node, where);
    check_rules(*k, v, where);
    values[key] = v;
    where_set[key] = where;
  }
}

}  // namespace

std::vector<std::string> list_items(const std::string& joined) {
  std::vector<std::string> items;
  for (std::size_t start = 0;;) {
    const std::size_t end = std::min(joined.find(',', start), joined.size());
    items.push_back(joined.substr(start, end - start));
    if (end == joined.size()) return items;
    start = end + 1;
  }
}

DeckSchema& DeckSchema::add_int(const std::string& key, std::int64_t def, std::string help, std::optional<double> min,
                                std::optional<double> max) {
  keys_.push_back({key, DeckKey::Type::Int, def, std::move(help), min, max, {}, {}});
  return *this;
}
DeckSchema& DeckSchema::add_float(const std::string& key, double def, std::string help, std::optional<double> min,
                                  std::optional<double> max) {
  keys_.push_back({key, DeckKey::Type::Float, def, std::move(help), min, max, {}, {}});
  return *this;
}
DeckSchema& DeckSchema::add_string(const std::string& key, std::string def, std::string help,
                                   std::vector<std::string> choices) {
  keys_.push_back({key, DeckKey::Type::String, std::move(def), std::move(help), {}, {}, std::move(choices), {}});
  return *this;
}
DeckSchema& DeckSchema::add_bool(const std::string& key, bool def, std::string help) {
  keys_.push_back({key, DeckKey::Type::Bool, def, std::move(help), {}, {}, {}, {}});
  return *this;
}
DeckSchema& DeckSchema::rename_key(const std::string& old_key, const std::string& new_key) {
  renamed_keys_[old_key] = new_key;
  return *this;
}

DeckSchema& DeckSchema::rename_choice(const std::string& key, const std::string& old_value,
                                      const std::string& new_value) {
  for (auto& k : keys_)
    if (k.key == key) k.renamed_choices[old_value] = new_value;
  return *this;
}

DeckSchema& DeckSchema::list(const std::string& key) {
  for (auto& k : keys_)
    if (k.key == key) k.list = true;
  return *this;
}

std::string DeckSchema::renamed(const std::string& old_key) const {
  const auto it = renamed_keys_.find(old_key);
  return it == renamed_keys_.end() ? std::string() : it->second;
}

const DeckKey* DeckSchema::find(const std::string& key) const {
  for (auto& k : keys_)
    if (k.key == key) return &k;
  return nullptr;
}
std::string DeckSchema::describe() const {
  std::ostringstream os;
  for (auto& k : keys_) {
    os << "  " << k.key << " (" << type_name(k.type) << ", default " << fmt_value(k.def);
    if (k.min) os << ", >= " << *k.min;
    if (k.max) os << ", <= " << *k.max;
    if (!k.choices.empty()) {
      os << ", one of";
      for (auto& c : k.choices) os << " " << c;
    }
    os << "): " << k.help << "\n";
  }
  return os.str();
}

Deck Deck::parse(const DeckSchema& schema, const std::string& text, const std::string& source,
                 const std::vector<std::string>& overrides) {
  Deck d;
  d.schema_ = &schema;
  d.source_ = source;
  d.text_ = text;
  for (auto& k : schema.keys()) d.values_[k.key] = k.def;
  toml::table tbl;
  try {
    tbl = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    HCP_INPUT_FAIL(source + ":" + std::to_string(e.source().begin.line), "TOML syntax error: ", e.description());
  }
  walk(tbl, "", schema, source, d.values_, d.where_);
  for (auto& o : overrides) {
    auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0) HCP_INPUT_FAIL("--set " + o, "expected section.key=value");
    std::string key = o.substr(0, eq), val = o.substr(eq + 1);
    const DeckKey* k = schema.find(key);
    if (!k && !schema.renamed(key).empty())
      HCP_INPUT_FAIL("--set " + o, "key '", key, "' is now '", schema.renamed(key), "'");
    if (!k) HCP_INPUT_FAIL("--set " + o, "unknown key '", key, "' (see --help-deck)");
    DeckValue v = from_text(*k, val, "--set " + o);
    check_rules(*k, v, "--set " + o);
    d.values_[key] = v;
    d.where_[key] = "--set " + o;
  }
  return d;
}

Deck Deck::load(const DeckSchema& schema, const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  HCP_INPUT_CHECK(!std::filesystem::is_directory(path, ec), "--deck " + path, "deck file '", path,
                  "' is a directory, not a TOML file");
  std::ifstream in(path, std::ios::binary);
  HCP_INPUT_CHECK(in.good(), "--deck " + path, "cannot read deck file '", path, "'");
  // A deck is a few hundred lines: read at most 1 MiB, so /dev/zero or a wrong file ends at once.
  constexpr std::size_t kMaxDeckBytes = std::size_t{1} << 20;
  std::string text(kMaxDeckBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  HCP_INPUT_CHECK(text.size() <= kMaxDeckBytes, "--deck " + path, "deck file '", path,
                  "' is larger than 1 MiB: not a deck (a deck is a short TOML file)");
  HCP_INPUT_CHECK(text.find('\0') == std::string::npos, "--deck " + path, "deck file '", path,
                  "' holds NUL bytes: not a TOML text file");
  return parse(schema, text, path, overrides);
}

const DeckValue& Deck::value(const std::string& key, DeckKey::Type t) const {
  HCP_CHECK(schema_, "deck not loaded");
  const DeckKey* k = schema_->find(key);
  HCP_CHECK(k, "deck key '", key, "' is not in this driver's schema");
  HCP_CHECK(k->type == t, "deck key '", key, "' read as ", type_name(t), " but declared ", type_name(k->type));
  return values_.at(key);
}

std::int64_t Deck::get_int(const std::string& key) const {
  return std::get<std::int64_t>(value(key, DeckKey::Type::Int));
}
double Deck::get_float(const std::string& key) const { return std::get<double>(value(key, DeckKey::Type::Float)); }
const std::string& Deck::get_string(const std::string& key) const {
  return std::get<std::string>(value(key, DeckKey::Type::String));
}
bool Deck::get_bool(const std::string& key) const { return std::get<bool>(value(key, DeckKey::Type::Bool)); }
bool Deck::is_set(const std::string& key) const { return where_.count(key) > 0; }
bool Deck::has(const std::string& key) const { return schema_ && schema_->find(key); }
std::string Deck::where(const std::string& key) const {
  auto it = where_.find(key);
  return it != where_.end() ? it->second : source_ + " (default)";
}

std::string Deck::resolved() const {
  // One table per section, in the order sections first appear in the schema (a section whose keys
  // are declared apart must still come out as one TOML table: a repeated table is a syntax error).
  std::vector<std::string> order;
  std::map<std::string, std::ostringstream> body;
  for (auto& k : schema_->keys()) {
    auto dot = k.key.rfind('.');
    std::string sec = dot == std::string::npos ? "" : k.key.substr(0, dot);
    std::string name = dot == std::string::npos ? k.key : k.key.substr(dot + 1);
    if (!body.count(sec)) order.push_back(sec);
    body[sec] << name << " = " << fmt_value(values_.at(k.key)) << "\n";
  }
  std::ostringstream os;
  for (auto& sec : order) {
    if (!sec.empty()) os << "\n[" << sec << "]\n";
    os << body[sec].str();
  }
  return os.str();
}

}  // namespace hcp
