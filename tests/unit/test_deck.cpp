#include <gtest/gtest.h>

#include "core/error.hpp"
#include "io/deck.hpp"

using namespace hcp;

namespace {
DeckSchema schema() {
  DeckSchema s;
  s.add_int("model.heads", 4, "attention heads", 1, 1024)
      .add_float("model.eps", 1e-5, "norm epsilon", 0.0)
      .add_string("cp.strategy", "p2p", "attention CP strategy", {"p2p", "allgather", "a2a"})
      .add_bool("run.backward", true, "run the backward pass");
  return s;
}
std::string message_of(const std::string& text, std::vector<std::string> sets = {}) {
  auto s = schema();
  try {
    Deck::parse(s, text, "deck.toml", sets);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Deck, DefaultsValuesAndOverrides) {
  auto s = schema();
  Deck d = Deck::parse(s, "[model]\nheads = 8\n", "x.toml", {"cp.strategy=a2a", "model.eps=1e-6"});
  EXPECT_EQ(d.get_int("model.heads"), 8);
  EXPECT_DOUBLE_EQ(d.get_float("model.eps"), 1e-6);
  EXPECT_EQ(d.get_string("cp.strategy"), "a2a");
  EXPECT_TRUE(d.get_bool("run.backward"));
  EXPECT_TRUE(d.is_set("model.heads"));
  EXPECT_FALSE(d.is_set("run.backward"));
  // Integers are accepted where a number is expected.
  Deck e = Deck::parse(s, "[model]\neps = 1\n", "x.toml");
  EXPECT_DOUBLE_EQ(e.get_float("model.eps"), 1.0);
  // The resolved deck parses back to the same values.
  Deck r = Deck::parse(s, d.resolved(), "resolved");
  EXPECT_EQ(r.get_string("cp.strategy"), "a2a");
  EXPECT_DOUBLE_EQ(r.get_float("model.eps"), 1e-6);
}

TEST(Deck, BadDecksNameKeyRuleAndLine) {
  // The message opens with the deck's file:line (no source location of the parser before it).
  std::string m = message_of("[model]\nheads = 8\nhidden = 3\n");
  EXPECT_EQ(m.rfind("deck.toml:3: unknown key 'model.hidden'", 0), 0u) << m;
  m = message_of("[model]\n\nheads = \"four\"\n");
  EXPECT_NE(m.find("deck.toml:3: key 'model.heads' must be an integer"), std::string::npos) << m;
  m = message_of("[model]\nheads = 0\n");
  EXPECT_NE(m.find("deck.toml:2: key 'model.heads' = 0 is out of range: must be >= 1"), std::string::npos) << m;
  m = message_of("[model]\neps = -1.0\n");
  EXPECT_NE(m.find("'model.eps' = -1.0 is out of range: must be >= 0"), std::string::npos) << m;
  m = message_of("[cp]\nstrategy = \"ring\"\n");
  EXPECT_NE(m.find("'cp.strategy' = \"ring\" is not one of: p2p, allgather, a2a"), std::string::npos) << m;
  m = message_of("[run]\nbackward = 1\n");
  EXPECT_NE(m.find("'run.backward' must be a boolean"), std::string::npos) << m;
  m = message_of("[model\nheads = 1\n");
  EXPECT_NE(m.find("deck.toml:1: TOML syntax error"), std::string::npos) << m;
  m = message_of("", {"model.heads=abc"});
  EXPECT_EQ(m.rfind("--set model.heads=abc: key 'model.heads' must be an integer", 0), 0u) << m;
  m = message_of("", {"model.nope=1"});
  EXPECT_NE(m.find("unknown key 'model.nope'"), std::string::npos) << m;
  m = message_of("", {"noequals"});
  EXPECT_NE(m.find("expected section.key=value"), std::string::npos) << m;
  m = message_of("", {"model.heads=2000"});
  EXPECT_NE(m.find("must be <= 1024"), std::string::npos) << m;
  auto s = schema();
  EXPECT_THROW(Deck::load(s, "/nonexistent/deck.toml"), Error);
}

TEST(Deck, WhereNamesTheLineTheSetOrTheDefault) {
  auto s = schema();
  Deck d = Deck::parse(s, "[model]\n\nheads = 8\n", "x.toml", {"cp.strategy=a2a"});
  EXPECT_EQ(d.where("model.heads"), "x.toml:3");
  EXPECT_EQ(d.where("cp.strategy"), "--set cp.strategy=a2a");
  EXPECT_EQ(d.where("model.eps"), "x.toml (default)");
}

TEST(Deck, ResolvedGroupsSectionsDeclaredApart) {
  DeckSchema s;
  s.add_int("a.x", 1, "x").add_int("b.y", 2, "y").add_int("a.z", 3, "z");
  Deck d = Deck::parse(s, "[a]\nz = 7\n", "x.toml");
  const std::string r = d.resolved();
  EXPECT_EQ(r.find("[a]"), r.rfind("[a]")) << r;
  Deck back = Deck::parse(s, r, "resolved");
  EXPECT_EQ(back.get_int("a.z"), 7);
  EXPECT_EQ(back.get_int("b.y"), 2);
}

// A list key takes a comma-separated string or a TOML array (deck and --set); a single-valued
// string key still refuses an array; bad arrays are refused naming the key and the rule.
TEST(Deck, ListKeysTakeArrays) {
  DeckSchema s;
  s.add_string("data.lens", "8", "lengths").add_string("data.format", "thd", "layout").list("data.lens");
  EXPECT_EQ(Deck::parse(s, "[data]\nlens = [100, 37]\n", "x.toml").get_string("data.lens"), "100,37");
  EXPECT_EQ(Deck::parse(s, "[data]\nlens = [\"a\", \"b\"]\n", "x.toml").get_string("data.lens"), "a,b");
  EXPECT_EQ(Deck::parse(s, "", "x.toml", {"data.lens=[4, 5]"}).get_string("data.lens"), "4,5");
  EXPECT_EQ(Deck::parse(s, "", "x.toml", {"data.lens=[a,\"b\"]"}).get_string("data.lens"), "a,b");
  EXPECT_EQ(Deck::parse(s, "[data]\nlens = \"3,4\"\n", "x.toml").get_string("data.lens"), "3,4");
  const auto message = [&](const std::string& text, std::vector<std::string> sets = {}) {
    try {
      Deck::parse(s, text, "x.toml", sets);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message("[data]\nformat = [\"thd\"]\n").find("x.toml:2: key 'data.format' must be a string"),
            std::string::npos);
  EXPECT_NE(
      message("[data]\nlens = [1.5]\n").find("x.toml:2: key 'data.lens': array items must be strings or integers"),
      std::string::npos);
  EXPECT_NE(message("[data]\nlens = []\n").find("key 'data.lens' is an empty array"), std::string::npos);
  EXPECT_NE(message("[data]\nlens = [\"a,b\"]\n").find("holds a comma"), std::string::npos);
  EXPECT_NE(message("", {"data.lens=[1,,2]"}).find("--set data.lens=[1,,2]: key 'data.lens': array item \"\" is empty"),
            std::string::npos);
  EXPECT_NE(message("", {"data.lens=[]"}).find("key 'data.lens' is an empty array"), std::string::npos);
}
