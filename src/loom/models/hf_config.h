// Reading transformers' config.json: the other direction of Architecture::hf_config. Each
// architecture's `from_hf` reads the fields it understands through an HfConfigReader, names the
// ones it may skip, and pins the ones whose other values would describe a model it cannot build
// (a rope scaling, biases, another activation). `finish()` then rejects any field nobody claimed,
// so a config.json from a newer transformers with a field that changes the model is an error
// naming that field, never a silently different model.
//
// Every error names the file and the field: "hf/config.json: rope_scaling = {...}: Loom has no
// rope scaling".
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace loom::models {

class HfConfigReader {
 public:
  HfConfigReader(nlohmann::json j, std::string file);

  bool has(const std::string& key) const;
  // A required integer / number / string field.
  int64_t integer(const std::string& key);
  double number(const std::string& key);
  std::string string(const std::string& key);
  // An optional field; `def` when it is absent or null.
  int64_t integer(const std::string& key, int64_t def);
  double number(const std::string& key, double def);
  bool boolean(const std::string& key, bool def);
  // The field, if present, must equal one of `allowed` (null counts as absent when `absent_ok`):
  // anything else describes a model Loom does not build; `why` says what is missing.
  void require(const std::string& key, std::initializer_list<nlohmann::json> allowed,
               const std::string& why, bool absent_ok = true);
  // Fields that do not change the model's function (token ids, dtypes, version, dropout, cache):
  // read and dropped.
  void ignore(std::initializer_list<const char*> keys);
  // The fields every transformers config may carry that never change the model's function (token
  // ids, dtype, version, cache, output switches, the initialiser's scale, the source's name).
  void ignore_common();
  // The object under `key` (for nested fields such as rope_parameters), itself read strictly.
  HfConfigReader nested(const std::string& key);
  // Throws naming the first field that no call above claimed.
  void finish() const;

  [[noreturn]] void bad(const std::string& key, const std::string& why) const;
  const std::string& file() const { return file_; }

 private:
  // The field, claimed; null when absent or null.
  const nlohmann::json* find(const std::string& key);
  // The field, which must be present and pass `is` (`want` names the type in the error).
  using IsType = bool (nlohmann::json::*)() const noexcept;
  const nlohmann::json& typed(const std::string& key, IsType is, const char* want);
  nlohmann::json j_;
  std::string file_, prefix_;
  std::set<std::string> claimed_;
};

}  // namespace loom::models
