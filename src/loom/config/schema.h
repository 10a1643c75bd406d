// A config section's schema: every key with its type, default, range and meaning.
//
// A room declares its own section over the struct it owns (`Section<S>`, built from the key
// builders below with pointers to S's fields); `train/config.cc` lifts each room's section into
// the whole `train::Config` and reads a file through them. From the same keys come the strict
// reader (a wrong type or an unknown key is an Error naming the file, the section and the key),
// the range check of every numeric key (the error names the value and the range, and says when the
// value is a default the file never set), and the key reference (docs/config.md, `loom config
// --keys`). A room's rules that involve several of its keys are its section's `check`.
#pragma once

#include <fmt/format.h>
#include <toml++/toml.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/config/fwd.h"
#include "loom/core/error.h"
#include "loom/core/suggest.h"

namespace loom::config {

// A numeric key's valid values: from lo to hi, either end open; an infinite end is no bound.
struct Range {
  double lo = -INFINITY, hi = INFINITY;
  bool lo_open = false, hi_open = false;

  bool any() const { return std::isinf(lo) && std::isinf(hi); }
  bool contains(double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
};
inline Range closed(double lo, double hi) { return {lo, hi}; }
inline Range at_least(double lo) { return {lo, INFINITY}; }
inline Range above(double lo) { return {lo, INFINITY, true}; }
inline Range below_one() { return {0, 1, false, true}; }  // [0, 1): betas, momentum
inline Range any_value() { return {}; }

// "[1, 2^20]", ">= 0", "(0, 1e6]"; "" for any value.
std::string range_text(const Range& r);
// "must be in [1, 2^20], got 0"
std::string out_of_range_text(const Range& r, double v);
std::string out_of_range_text(const Range& r, const std::string& got);  // the value as written
// The integer in `n`, if it holds one (toml++ would convert a float node, and a huge one is
// undefined behaviour: this asks first).
std::optional<int64_t> integer_in(const toml::node& n);
// `"x"` as the docs print a default; "none" for "".
std::string quoted(const std::string& s);
// "\"sync\" or \"async\"" (markdown: each in backticks)
std::string choice_list(const std::vector<std::string>& choices, bool markdown);
// Where the string in `n` stands in `choices`; else an Error naming `where` that lists them.
size_t choice_index(const toml::node& n, const std::string& where,
                    const std::vector<std::string>& choices);

// One key of a section over the struct S.
template <class S>
struct Key {
  std::string name;  // "batch_size"
  std::string type;  // "int", "float", "bool", "string", ...
  // reads `n` into the struct (type-checked; a bad value throws naming `where`)
  std::function<void(S&, const toml::node& n, const std::string& where)> set;
  // numeric keys: "" when the value is in `range`, else "must be in [1, 2^20], got 0"
  std::function<std::string(S&)> out_of_range;
  Range range;
  std::string default_text;  // as the docs print it
  std::string meaning;       // what it does, its choices, rules that involve other keys
  // an inline table's own keys (`moe = { top_k = 2 }`: "moe.top_k"), for the reference and the
  // range checks
  std::vector<Key> members;
};

// A section: its keys in the order the reference lists them, and its rules that involve several
// of its keys (run once every key is set).
template <class S>
struct Section {
  std::string name;  // "outer": the file's [outer]
  std::vector<Key<S>> keys;
  std::function<void(S&, const Fail&)> check;
};

namespace detail {
template <class S, class T>
T default_of(T S::*field) {
  // made once and kept (GCC 12 warns of a whole train::Config destroyed here: a false positive)
  static const S* defaults = new S{};
  return defaults->*field;
}
template <class S, class T>
std::function<std::string(S&)> range_check(T S::*field, Range range) {
  return [field, range](S& s) -> std::string {
    const double v = double(s.*field);
    if (range.contains(v)) return "";
    // an integer as written (as a double, 2^62 would read 4.611686018427388e+18)
    if constexpr (std::is_integral_v<T>)
      return out_of_range_text(range, fmt::format("{}", s.*field));
    return out_of_range_text(range, v);
  };
}
}  // namespace detail

template <class S>
Key<S> int_key(std::string name, int64_t S::*field, Range range, std::string meaning,
               std::string default_text = "") {
  return {std::move(name),
          "int",
          [field](S& s, const toml::node& n, const std::string& where) {
            auto v = integer_in(n);
            if (!v) throw Error(where + ": expected an integer");
            s.*field = *v;
          },
          detail::range_check(field, range),
          range,
          default_text.empty() ? fmt::format("{}", detail::default_of(field)) : default_text,
          std::move(meaning),
          {}};
}

// The type a float key's value is used in: the kernels' f32 (the default: learning rates, betas,
// epsilons, loss weights), or f64 (seconds, sizes, factors the host computes with).
enum class Used { f32, f64 };

// "" when v, used as `used`, is in `range`; else why not. An f32 value is checked as f32 holds it:
// a value f32 cannot hold (1e39) or that it rounds to zero (1e-50) or to another value out of the
// range (beta2 = 0.999999999 is 1.0f) is refused, saying so.
std::string float_out_of_range(const Range& range, double v, Used used);

template <class S>
Key<S> float_key(std::string name, double S::*field, Range range, std::string meaning,
                 Used used = Used::f32) {
  return {std::move(name),
          "float",
          [field](S& s, const toml::node& n, const std::string& where) {
            if (!n.is_number()) throw Error(where + ": expected a number");
            const double v = *n.value<double>();
            // no key means anything by inf or nan (norm_eps = inf trains a model that learns
            // nothing)
            if (!std::isfinite(v))
              throw Error(fmt::format("{}: must be a finite number, got {}", where, v));
            s.*field = v;
          },
          [field, range, used](S& s) { return float_out_of_range(range, s.*field, used); },
          range,
          fmt::format("{}", detail::default_of(field)),
          std::move(meaning),
          {}};
}

template <class S>
Key<S> bool_key(std::string name, bool S::*field, std::string meaning) {
  return {std::move(name),
          "bool",
          [field](S& s, const toml::node& n, const std::string& where) {
            if (!n.is_boolean()) throw Error(where + ": expected true or false");
            s.*field = *n.value<bool>();
          },
          nullptr,
          {},
          detail::default_of(field) ? "true" : "false",
          std::move(meaning),
          {}};
}

template <class S>
Key<S> string_key(std::string name, std::string S::*field, std::string meaning,
                  std::string default_text = "") {
  return {std::move(name),
          "string",
          [field](S& s, const toml::node& n, const std::string& where) {
            if (!n.is_string()) throw Error(where + ": expected a string");
            s.*field = *n.value<std::string>();
          },
          nullptr,
          {},
          default_text.empty() ? quoted(detail::default_of(field)) : default_text,
          std::move(meaning),
          {}};
}

// A string that must be one of `choices`; `assign` stores the index of the one given.
template <class S>
Key<S> choice_key(std::string name, std::vector<std::string> choices,
                  std::function<void(S&, size_t)> assign, std::string default_name,
                  std::string meaning) {
  std::string doc = choice_list(choices, true) + (meaning.empty() ? "" : ": " + meaning);
  return {std::move(name),
          "string",
          [choices, assign](S& s, const toml::node& n, const std::string& where) {
            assign(s, choice_index(n, where, choices));
          },
          nullptr,
          {},
          quoted(default_name),
          std::move(doc),
          {}};
}

// A string field that must be one of `choices`.
template <class S>
Key<S> string_choice_key(std::string name, std::string S::*field, std::vector<std::string> choices,
                         std::string meaning) {
  auto assign = [field, choices](S& s, size_t i) { s.*field = choices[i]; };
  return choice_key<S>(std::move(name), choices, assign, detail::default_of(field),
                       std::move(meaning));
}

// An enum field, written as its name (`spell`), one of `values`.
template <class S, class E>
Key<S> enum_key(std::string name, E S::*field, std::vector<E> values, const char* (*spell)(E),
                std::string meaning) {
  std::vector<std::string> names;
  for (E v : values) names.push_back(spell(v));
  auto assign = [field, values](S& s, size_t i) { s.*field = values[i]; };
  return choice_key<S>(std::move(name), names, assign, spell(detail::default_of(field)),
                       std::move(meaning));
}

// A list of integers, each in `range`, at most `max_len` of them.
template <class S>
Key<S> int_list_key(std::string name, std::vector<int64_t> S::*field, Range range, size_t max_len,
                    std::string meaning) {
  return {std::move(name),
          "int list",
          [field, range, max_len](S& s, const toml::node& n, const std::string& where) {
            const toml::array* a = n.as_array();
            if (!a) throw Error(where + ": expected a list of integers, as [2, 2]");
            if (a->size() > max_len)
              throw Error(fmt::format("{}: at most {} entries, got {}", where, max_len, a->size()));
            std::vector<int64_t> v;
            for (const toml::node& e : *a) {
              auto x = integer_in(e);
              if (!x) throw Error(where + ": expected a list of integers, as [2, 2]");
              if (!range.contains(double(*x)))
                throw Error(fmt::format("{}: each entry must be in {}, got {}", where,
                                        range_text(range), *x));
              v.push_back(*x);
            }
            s.*field = std::move(v);
          },
          nullptr,
          range,
          "none",
          std::move(meaning),
          {}};
}

template <class K>
const K* find_named(const std::vector<K>& keys, const std::string& name) {
  for (const auto& k : keys)
    if (k.name == name) return &k;
  return nullptr;
}
template <class K>
std::vector<std::string> names_of(const std::vector<K>& keys) {
  std::vector<std::string> r;
  for (const auto& k : keys) r.push_back(k.name);
  return r;
}

// Reads the keys of the inline table in `n` (`where` names it) into `s`: strict, as a section is.
template <class S>
void read_table(const std::vector<Key<S>>& keys, S& s, const toml::node& n,
                const std::string& where, const std::string& example) {
  const toml::table* t = n.as_table();
  if (!t) throw Error(fmt::format("{}: expected a table {}", where, example));
  for (const auto& [k, v] : *t) {
    const std::string key(k.str());
    const Key<S>* it = find_named(keys, key);
    if (!it)
      throw Error(fmt::format("{}: unknown key '{}'", where, key), suggest(key, names_of(keys)));
    it->set(s, v, where + "." + key);
  }
}

// Key<T> seen through `proj` (S& -> T&), as a key of S: how a room's section joins the whole
// config, or a struct's keys an inline table's.
template <class S, class T, class P>
Key<S> lift(const Key<T>& k, P proj) {
  Key<S> r{k.name, k.type, nullptr, nullptr, k.range, k.default_text, k.meaning, {}};
  r.set = [set = k.set, proj](S& s, const toml::node& n, const std::string& where) {
    set(std::invoke(proj, s), n, where);
  };
  if (k.out_of_range)
    r.out_of_range = [f = k.out_of_range, proj](S& s) { return f(std::invoke(proj, s)); };
  for (const Key<T>& m : k.members) r.members.push_back(lift<S>(m, proj));
  return r;
}

template <class S, class T, class P>
Section<S> lift(const Section<T>& sec, P proj) {
  Section<S> r{sec.name, {}, nullptr};
  for (const Key<T>& k : sec.keys) r.keys.push_back(lift<S>(k, proj));
  if (sec.check)
    r.check = [check = sec.check, proj](S& s, const Fail& fail) {
      check(std::invoke(proj, s), fail);
    };
  return r;
}

// An inline table of T's keys in the field `field` (`moe = { experts = 8, top_k = 2 }`): written,
// it starts from T's defaults.
template <class S, class T>
Key<S> table_key(std::string name, T S::*field, std::vector<Key<T>> keys, std::string example,
                 std::string default_text, std::string meaning) {
  Key<S> r{name, "inline table", nullptr, nullptr, {}, std::move(default_text), std::move(meaning),
           {}};
  r.set = [field, keys, example](S& s, const toml::node& n, const std::string& where) {
    s.*field = T{};
    read_table(keys, s.*field, n, where, example);
  };
  for (const Key<T>& m : keys) {
    Key<S> lifted = lift<S>(m, field);
    lifted.name = name + "." + m.name;
    r.members.push_back(std::move(lifted));
  }
  return r;
}

// Every key of `sections` with its section's name: f(section, "moe.top_k", key) for an inline
// table's member, after the table itself.
template <class S, class F>
void for_each_key(const Section<S>& sec, F f) {
  for (const Key<S>& k : sec.keys) {
    f(sec.name, k);
    for (const Key<S>& m : k.members) f(sec.name, m);
  }
}
template <class S, class F>
void for_each_key(const std::vector<Section<S>>& sections, F f) {
  for (const Section<S>& sec : sections) for_each_key(sec, f);
}

// The sections as markdown, a table each: every key with its type, default, range and meaning.
template <class S>
std::string reference(const std::vector<Section<S>>& sections) {
  std::string out;
  for (const Section<S>& sec : sections) {
    out += fmt::format(
        "\n## `[{}]`\n\n| key | type | default | range and meaning |\n"
        "| --- | --- | --- | --- |\n",
        sec.name);
    for_each_key(sec, [&](const std::string& section, const Key<S>& k) {
      std::string doc = range_text(k.range);
      if (!doc.empty()) doc = "`" + doc + "`";
      if (!k.meaning.empty()) doc += (doc.empty() ? "" : ": ") + k.meaning;
      out += fmt::format("| `[{}] {}` | {} | {} | {} |\n", section, k.name, k.type, k.default_text,
                         doc);
    });
  }
  return out;
}

// What a file (`path`) gave: every "[section] key" it or an override set. `fail` reports a broken
// rule of a key, and says when the value is a default the file never set.
class Written {
 public:
  explicit Written(std::string path) : path_(std::move(path)) {}
  void add(const std::string& key) { keys_.insert(key); }
  bool has(const std::string& key) const { return keys_.count(key) > 0; }
  [[noreturn]] void fail(const std::string& key, const std::string& why) const;
  Fail failer() const {
    return [this](const std::string& key, const std::string& why) { fail(key, why); };
  }

 private:
  std::string path_;
  std::set<std::string> keys_;
};

// Reads `root` (the file `path`) into `s` through `sections`: an unknown section or key, or a
// value of the wrong type, is an Error naming the file and the key.
template <class S>
Written read(const std::vector<Section<S>>& sections, const toml::table& root, S& s,
             const std::string& path) {
  Written written(path);
  for (const auto& [sk, sv] : root) {
    std::string section(sk.str());
    const Section<S>* sit = find_named(sections, section);
    if (!sit)
      throw Error(fmt::format("{}: unknown section [{}]", path, section),
                  suggest(section, names_of(sections)));
    const toml::table* t = sv.as_table();
    if (!t) throw Error(fmt::format("{}: [{}] must be a table", path, section));
    for (const auto& [kk, kv] : *t) {
      std::string key(kk.str());
      const Key<S>* kit = find_named(sit->keys, key);
      if (!kit)
        throw Error(fmt::format("{}: unknown key '{}' in [{}]", path, key, section),
                    suggest(key, names_of(sit->keys)));
      kit->set(s, kv, fmt::format("{}: [{}] {}", path, section, key));
      written.add(fmt::format("[{}] {}", section, key));
      // an inline table's members the file gives ("[model] moe.experts") are the file's too
      if (const toml::table* inner = kv.as_table())
        for (const auto& [mk, mv] : *inner)
          written.add(fmt::format("[{}] {}.{}", section, key, std::string(mk.str())));
    }
  }
  return written;
}

// Every numeric key of `sections` in its range, whoever set it.
template <class S>
void check_ranges(const std::vector<Section<S>>& sections, S& s, const Written& written) {
  for_each_key(sections, [&](const std::string& section, const Key<S>& k) {
    if (!k.out_of_range) return;
    if (const std::string why = k.out_of_range(s); !why.empty())
      written.fail(fmt::format("[{}] {}", section, k.name), why);
  });
}

// Each section's own rules, in the sections' order.
template <class S>
void check_rules(const std::vector<Section<S>>& sections, S& s, const Written& written) {
  for (const Section<S>& sec : sections)
    if (sec.check) sec.check(s, written.failer());
}

// Applies `--set section.key=value` (the value in TOML syntax; a bare word is a string) to `root`,
// read from `path`.
void apply_override(toml::table& root, const std::string& path, const std::string& override_text);

}  // namespace loom::config
