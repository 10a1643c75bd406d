// The schema's keys on a small struct of their own: reading, type errors, ranges, inline tables,
// lifting a section into a larger struct, and the reference it prints.
#include "loom/config/schema.h"

#include <gtest/gtest.h>

namespace loom::config {
namespace {

enum class Mode { fast, slow };
const char* mode_name(Mode m) { return m == Mode::fast ? "fast" : "slow"; }

struct Inner {
  int64_t k = 2;
};
struct Part {
  int64_t n = 4;
  double x = 0.5;
  double eps = 1e-8;     // used as f32
  double seconds = 1.0;  // used as f64
  bool on = false;
  std::string name;
  Mode mode = Mode::fast;
  std::vector<int64_t> list;
  Inner inner;
};
struct Whole {
  Part part;
  int64_t extra = 1;
};

Section<Part> part_section() {
  return {"part",
          {
              int_key("n", &Part::n, closed(1, 8), "a count"),
              float_key("x", &Part::x, below_one(), ""),
              float_key("eps", &Part::eps, above(0), ""),
              float_key("seconds", &Part::seconds, above(0), "", Used::f64),
              bool_key("on", &Part::on, ""),
              string_key("name", &Part::name, "a name"),
              enum_key("mode", &Part::mode, {Mode::fast, Mode::slow}, mode_name, ""),
              int_list_key("list", &Part::list, closed(0, 9), 3, ""),
              table_key("inner", &Part::inner, {int_key("k", &Inner::k, at_least(1), "")},
                        "{ k = ... }", "none", "an inline table"),
          },
          [](Part& p, const Fail& fail) {
            if (p.on && p.name.empty()) fail("[part] name", "needed when on");
          }};
}

std::vector<Section<Whole>> whole() {
  return {lift<Whole>(part_section(), &Whole::part),
          {"whole", {int_key("extra", &Whole::extra, at_least(0), "")}, nullptr}};
}

Whole read_text(const std::string& text) {
  Whole w;
  const auto sections = whole();
  const Written written = read(sections, toml::parse(text), w, "f.toml");
  check_ranges(sections, w, written);
  check_rules(sections, w, written);
  return w;
}

std::string error_of(const std::string& text) {
  try {
    read_text(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Schema, ReadsEveryKindOfKeyThroughALiftedSection) {
  const Whole w = read_text(
      "[part]\nn = 3\nx = 0.25\non = true\nname = \"a\"\nmode = \"slow\"\nlist = [1, 2]\n"
      "inner = { k = 5 }\n[whole]\nextra = 7\n");
  EXPECT_EQ(w.part.n, 3);
  EXPECT_EQ(w.part.x, 0.25);
  EXPECT_TRUE(w.part.on);
  EXPECT_EQ(w.part.name, "a");
  EXPECT_EQ(w.part.mode, Mode::slow);
  EXPECT_EQ(w.part.list, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(w.part.inner.k, 5);
  EXPECT_EQ(w.extra, 7);
  // nothing written: the defaults
  const Whole d = read_text("");
  EXPECT_EQ(d.part.n, 4);
  EXPECT_EQ(d.part.inner.k, 2);
}

TEST(Schema, ErrorsNameTheFileSectionAndKey) {
  EXPECT_NE(error_of("[part]\nn = 1.5\n").find("f.toml: [part] n: expected an integer"),
            std::string::npos);
  EXPECT_NE(error_of("[part]\nx = \"a\"\n").find("[part] x: expected a number"), std::string::npos);
  EXPECT_NE(error_of("[part]\nmode = \"medium\"\n").find("expected \"fast\" or \"slow\""),
            std::string::npos);
  EXPECT_NE(error_of("[part]\nnn = 1\n").find("unknown key 'nn' in [part]"), std::string::npos);
  EXPECT_NE(error_of("[part]\nnn = 1\n").find("did you mean 'n'"), std::string::npos);
  EXPECT_NE(error_of("[prat]\n").find("unknown section [prat]"), std::string::npos);
  EXPECT_NE(error_of("[part]\ninner = { j = 1 }\n").find("[part] inner: unknown key 'j'"),
            std::string::npos);
  EXPECT_NE(error_of("[part]\nlist = [1, 2, 3, 4]\n").find("at most 3 entries"), std::string::npos);
  EXPECT_NE(error_of("[part]\nx = nan\n").find("must be a finite number"), std::string::npos);
}

TEST(Schema, RangesAndRulesSayWhenTheValueIsADefault) {
  EXPECT_NE(error_of("[part]\nn = 9\n").find("[part] n: must be in [1, 8], got 9"),
            std::string::npos);
  // an inline table's member, by its dotted name
  EXPECT_NE(error_of("[part]\ninner = { k = 0 }\n").find("[part] inner.k: must be >= 1, got 0"),
            std::string::npos);
  // the section's rule, on a key the file never set
  const std::string e = error_of("[part]\non = true\n");
  EXPECT_NE(e.find("[part] name: needed when on (that is its default value"), std::string::npos);
  EXPECT_NE(e.find("set [part] name in the config, or with --set"), std::string::npos);
}

TEST(Schema, ReferenceAndKeysListEveryKey) {
  const std::string ref = reference(whole());
  EXPECT_NE(ref.find("## `[part]`"), std::string::npos);
  EXPECT_NE(ref.find("| `[part] n` | int | 4 | `[1, 8]`: a count |"), std::string::npos);
  EXPECT_NE(ref.find("| `[part] inner.k` | int | 2 | `>= 1` |"), std::string::npos);
  EXPECT_NE(ref.find("| `[part] mode` | string | `\"fast\"` |"), std::string::npos);
  EXPECT_NE(ref.find("| `[whole] extra` | int | 1 |"), std::string::npos);
  int keys = 0;
  for_each_key(whole(), [&](const std::string&, const Key<Whole>&) { ++keys; });
  EXPECT_EQ(keys, 11);  // 9 of part, inner.k, extra
}

TEST(Schema, OverridesSetKeysAndRefuseAMalformedOne) {
  toml::table root = toml::parse("[part]\nn = 2\n");
  apply_override(root, "f.toml", "part.n=5");
  apply_override(root, "f.toml", "part.name=word");
  Whole w;
  read(whole(), root, w, "f.toml");
  EXPECT_EQ(w.part.n, 5);
  EXPECT_EQ(w.part.name, "word");
  EXPECT_THROW(apply_override(root, "f.toml", "n=5"), Error);
}

// A float key is checked in the type it is used in: an f32 key refuses what f32 cannot hold, what
// it rounds to 0, and what it rounds out of the range (x in [0, 1): 0.9999999999 is 1.0f); an f64
// key takes them.
TEST(Schema, FloatKeysAreCheckedInTheTypeTheyAreUsedIn) {
  EXPECT_NE(error_of("[part]\nx = 0.9999999999\n")
                .find("[part] x: is used as a 32-bit float, in "
                      "which 0.9999999999 is 1"),
            std::string::npos)
      << error_of("[part]\nx = 0.9999999999\n");
  EXPECT_NE(error_of("[part]\neps = 1e-50\n").find("in which 1e-50 is 0"), std::string::npos)
      << error_of("[part]\neps = 1e-50\n");
  EXPECT_NE(error_of("[part]\neps = 1e39\n").find("cannot hold 1e+39"), std::string::npos)
      << error_of("[part]\neps = 1e39\n");
  EXPECT_EQ(error_of("[part]\nx = 0.99999\neps = 1e-30\n"), "");  // f32 holds both
  EXPECT_EQ(error_of("[part]\nseconds = 1e-50\n"), "");           // f64: as written
  EXPECT_EQ(read_text("[part]\nseconds = 1e39\n").part.seconds, 1e39);
}

// An inline table's member the file sets out of range is the file's value, not "its default".
TEST(Schema, AnInlineTablesMemberIsTheFilesWhenItGivesIt) {
  const std::string given = error_of("[part]\ninner = { k = 0 }\n");
  EXPECT_NE(given.find("[part] inner.k: must be >= 1, got 0"), std::string::npos) << given;
  EXPECT_EQ(given.find("default"), std::string::npos) << given;
}

}  // namespace
}  // namespace loom::config
