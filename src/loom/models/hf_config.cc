#include "loom/models/hf_config.h"

#include <fmt/format.h>

#include <algorithm>

#include "loom/core/error.h"

namespace loom::models {

HfConfigReader::HfConfigReader(nlohmann::json j, std::string file)
    : j_(std::move(j)), file_(std::move(file)) {
  if (!j_.is_object()) throw Error(fmt::format("{}: expected a JSON object", file_));
}

void HfConfigReader::bad(const std::string& key, const std::string& why) const {
  const nlohmann::json* v = j_.contains(key) ? &j_.at(key) : nullptr;
  std::string shown = v ? v->dump() : "(absent)";
  if (shown.size() > 80) shown = shown.substr(0, 77) + "...";
  throw Error(fmt::format("{}: {}{} = {}: {}", file_, prefix_, key, shown, why));
}

bool HfConfigReader::has(const std::string& key) const {
  return j_.contains(key) && !j_.at(key).is_null();
}

const nlohmann::json* HfConfigReader::find(const std::string& key) {
  claimed_.insert(key);
  return has(key) ? &j_.at(key) : nullptr;
}

const nlohmann::json& HfConfigReader::typed(const std::string& key, IsType is, const char* want) {
  const nlohmann::json* v = find(key);
  if (!v) bad(key, "a required field is missing");
  if (!(v->*is)()) bad(key, std::string("expected ") + want);
  return *v;
}

int64_t HfConfigReader::integer(const std::string& key) {
  const nlohmann::json& v = typed(key, &nlohmann::json::is_number_integer, "an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))  // not wrapped negative
    bad(key, fmt::format("{} is past 2^63-1", v.dump()));
  return v.get<int64_t>();
}

double HfConfigReader::number(const std::string& key) {
  return typed(key, &nlohmann::json::is_number, "a number").get<double>();
}

std::string HfConfigReader::string(const std::string& key) {
  return typed(key, &nlohmann::json::is_string, "a string").get<std::string>();
}

int64_t HfConfigReader::integer(const std::string& key, int64_t def) {
  return find(key) ? integer(key) : def;
}

double HfConfigReader::number(const std::string& key, double def) {
  return find(key) ? number(key) : def;
}

bool HfConfigReader::boolean(const std::string& key, bool def) {
  return find(key) ? typed(key, &nlohmann::json::is_boolean, "true or false").get<bool>() : def;
}

void HfConfigReader::require(const std::string& key, std::initializer_list<nlohmann::json> allowed,
                             const std::string& why, bool absent_ok) {
  const nlohmann::json* v = find(key);
  if (!v) {
    if (absent_ok) return;
    bad(key, why);
  }
  for (const auto& a : allowed)
    if (*v == a || (v->is_number() && a.is_number() && v->get<double>() == a.get<double>())) return;
  bad(key, why);
}

void HfConfigReader::ignore(std::initializer_list<const char*> keys) {
  for (const char* k : keys) claimed_.insert(k);
}

void HfConfigReader::ignore_common() {
  // token ids change nothing the model computes, but what reads them (sampling's end of turn,
  // export) takes them as ids: null, an id or a list of ids
  for (const char* k : {"bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id",
                        "sep_token_id", "decoder_start_token_id"}) {
    const nlohmann::json* v = find(k);
    if (!v) continue;
    auto id = [](const nlohmann::json& x) {
      return x.is_number_integer() && x.get<int64_t>() >= 0 && x.get<int64_t>() <= INT32_MAX;
    };
    if (!id(*v) && !(v->is_array() && std::all_of(v->begin(), v->end(), id)))
      bad(k, "expected a token id (or a list of them)");
  }
  ignore({"torch_dtype", "dtype", "transformers_version", "use_cache", "initializer_range",
          "_name_or_path", "_model_name_or_path", "output_attentions", "output_hidden_states",
          "return_dict", "chunk_size_feed_forward", "tokenizer_class"});
}

HfConfigReader HfConfigReader::nested(const std::string& key) {
  const nlohmann::json* v = find(key);
  if (!v || !v->is_object()) bad(key, "expected an object");
  HfConfigReader r(*v, file_);
  r.prefix_ = prefix_ + key + ".";
  return r;
}

void HfConfigReader::finish() const {
  for (const auto& [k, v] : j_.items())
    if (!claimed_.count(k))
      bad(k,
          "a field Loom does not know: it may change the model, so it is not ignored "
          "(if it does not, list it in the architecture's from_hf ignore list)");
}

}  // namespace loom::models
