#include "loom/config/schema.h"

#include <algorithm>
#include <limits>

namespace loom::config {

namespace {
// A bound as users read it: 2^20 for a large power of two, 2^31-1 beside one, 1e6 for a large power
// of ten, else the shortest decimal.
std::string bound_text(double x) {
  for (int k = 16; k < 63; ++k) {
    const double p = std::ldexp(1.0, k);
    if (x == p) return fmt::format("2^{}", k);
    if (x == p - 1) return fmt::format("2^{}-1", k);
  }
  for (int k = 5; k < 16; ++k)
    if (x == std::pow(10.0, k)) return fmt::format("1e{}", k);
  return fmt::format("{}", x);
}
}  // namespace

std::string range_text(const Range& r) {
  if (r.any()) return "";
  if (std::isinf(r.hi)) return fmt::format("{} {}", r.lo_open ? ">" : ">=", bound_text(r.lo));
  return fmt::format("{}{}, {}{}", r.lo_open ? "(" : "[", bound_text(r.lo), bound_text(r.hi),
                     r.hi_open ? ")" : "]");
}

std::string out_of_range_text(const Range& r, double v) {
  return out_of_range_text(r, fmt::format("{}", v));
}

std::string out_of_range_text(const Range& r, const std::string& got) {
  return fmt::format("must be {}{}, got {}", std::isinf(r.hi) ? "" : "in ", range_text(r), got);
}

std::string float_out_of_range(const Range& range, double v, Used used) {
  if (!range.contains(v)) return out_of_range_text(range, v);
  if (used == Used::f64) return "";
  const float f = float(v);
  if (!std::isfinite(f))
    return fmt::format("is used as a 32-bit float, which cannot hold {} (at most about 3.4e38)", v);
  if (v != 0 && f == 0)
    return fmt::format(
        "is used as a 32-bit float, in which {} is 0 (the smallest is about 1.4e-45)", v);
  if (v != 0 && std::fabs(f) < std::numeric_limits<float>::min())  // flushed to 0 under FTZ
    return fmt::format(
        "is used as a 32-bit float, in which {} is subnormal (the smallest normal is about "
        "1.2e-38)",
        v);
  if (!range.contains(double(f)))
    return fmt::format("is used as a 32-bit float, in which {} is {}: {}", v, f,
                       out_of_range_text(range, double(f)));
  return "";
}

std::optional<int64_t> integer_in(const toml::node& n) {
  if (!n.is_integer()) return std::nullopt;
  return n.value<int64_t>();
}

std::string quoted(const std::string& s) { return s.empty() ? "none" : "`\"" + s + "\"`"; }

std::string choice_list(const std::vector<std::string>& choices, bool markdown) {
  std::string list;
  for (size_t i = 0; i < choices.size(); ++i) {
    const char* sep = i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ";
    const std::string q = "\"" + choices[i] + "\"";
    list += sep + (markdown ? "`" + q + "`" : q);
  }
  return list;
}

size_t choice_index(const toml::node& n, const std::string& where,
                    const std::vector<std::string>& choices) {
  auto v = n.value<std::string>();
  auto it = v ? std::find(choices.begin(), choices.end(), *v) : choices.end();
  if (!n.is_string() || it == choices.end())
    throw Error(where + ": expected " + choice_list(choices, false));
  return size_t(it - choices.begin());
}

void Written::fail(const std::string& key, const std::string& why) const {
  if (has(key)) throw Error(fmt::format("{}: {}: {}", path_, key, why));
  throw Error(fmt::format("{}: {}: {} (that is its default value: the file does not set it)", path_,
                          key, why),
              fmt::format("set {} in the config, or with --set", key));
}

void apply_override(toml::table& root, const std::string& path, const std::string& ov) {
  size_t eq = ov.find('=');
  size_t dot = ov.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq)
    throw Error(fmt::format("--set {}: expected section.key=value", ov),
                "for example --set model.dtype=bf16");
  std::string section = ov.substr(0, dot), key = ov.substr(dot + 1, eq - dot - 1);
  std::string value = ov.substr(eq + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", value}};  // a bare word: a string
  }
  if (!root.contains(section)) root.insert(section, toml::table{});
  toml::table* sec = root[section].as_table();
  if (!sec) throw Error(fmt::format("{}: [{}] is not a table", path, section));
  sec->insert_or_assign(key, *parsed["v"].node());
}

}  // namespace loom::config
