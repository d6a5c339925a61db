// Input decks (TOML) against a declared schema: typed values, defaults, ranges, choices.
// Unknown keys, wrong types and out-of-range values are errors naming the file line, the key and
// the rule. `--set section.key=value` overrides are checked by the same rules.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace hcp {

using DeckValue = std::variant<std::int64_t, double, std::string, bool>;

struct DeckKey {
  enum class Type { Int, Float, String, Bool };
  std::string key;  // "section.name"
  Type type = Type::Int;
  DeckValue def;  // default value (of `type`)
  std::string help;
  std::optional<double> min, max;                      // inclusive range (Int, Float)
  std::vector<std::string> choices;                    // allowed strings (String), empty = any
  std::map<std::string, std::string> renamed_choices;  // an old value -> its new name (refused, naming it)
  bool list = false;  // a comma-separated list (String): a TOML array of strings or integers is joined with ','
};

class DeckSchema {
 public:
  DeckSchema& add_int(const std::string& key, std::int64_t def, std::string help, std::optional<double> min = {},
                      std::optional<double> max = {});
  DeckSchema& add_float(const std::string& key, double def, std::string help, std::optional<double> min = {},
                        std::optional<double> max = {});
  DeckSchema& add_string(const std::string& key, std::string def, std::string help,
                         std::vector<std::string> choices = {});
  DeckSchema& add_bool(const std::string& key, bool def, std::string help);
  // An old key name, refused with a message naming the new one; an old value of a key, likewise.
  DeckSchema& rename_key(const std::string& old_key, const std::string& new_key);
  DeckSchema& rename_choice(const std::string& key, const std::string& old_value, const std::string& new_value);
  // Marks a String key as a comma-separated list: the deck may also give it as a TOML array
  // (seq_lens = [100, 200]) and --set as [100,200].
  DeckSchema& list(const std::string& key);
  std::string renamed(const std::string& old_key) const;  // "" when `old_key` is not a former name
  const DeckKey* find(const std::string& key) const;
  const std::vector<DeckKey>& keys() const { return keys_; }
  std::string describe() const;  // one line per key, for --help-deck

 private:
  std::vector<DeckKey> keys_;
  std::map<std::string, std::string> renamed_keys_;
};

// The comma-separated items of a list key's value, as written (no trimming; empty items kept).
std::vector<std::string> list_items(const std::string& joined);

class Deck {
 public:
  // `text` is TOML; `source` names it in messages (a path, or "<builtin>").
  static Deck parse(const DeckSchema& schema, const std::string& text, const std::string& source,
                    const std::vector<std::string>& overrides = {});
  static Deck load(const DeckSchema& schema, const std::string& path, const std::vector<std::string>& overrides = {});

  std::int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  bool is_set(const std::string& key) const;  // given in the deck or by --set (not a default)
  bool has(const std::string& key) const;     // in this driver's schema
  // Where a key's value came from, to open a message about it: "deck.toml:12", "--set k=v", or
  // "deck.toml (default)".
  std::string where(const std::string& key) const;

  const std::string& source() const { return source_; }
  const std::string& text() const { return text_; }  // deck text as read
  std::string resolved() const;                      // every key with its effective value, TOML

 private:
  const DeckValue& value(const std::string& key, DeckKey::Type t) const;
  const DeckSchema* schema_ = nullptr;
  std::map<std::string, DeckValue> values_;
  std::map<std::string, std::string> where_;  // key -> file:line or --set, for keys given
  std::string source_, text_;
};

}  // namespace hcp
