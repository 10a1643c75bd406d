// What a room's header needs to declare its config section without the schema's templates and
// toml++ (config/schema.h).
#pragma once

#include <functional>
#include <string>

namespace loom::config {

template <class S>
struct Key;
template <class S>
struct Section;
// Reports a broken rule of `key` ("[outer] fragments") and throws; `why` says what is wrong.
using Fail = std::function<void(const std::string& key, const std::string& why)>;

}  // namespace loom::config
