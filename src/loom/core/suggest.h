// "Did you mean": the hint an error about an unknown key or name gives.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace loom {

// "did you mean 'x'?" for the known word within two edits of `word`; else "known keys: a, b, ...".
std::string suggest(const std::string& word, const std::vector<std::string>& known);
// The known word within two edits of `word` (the nearest), if any.
std::optional<std::string> nearest(const std::string& word, const std::vector<std::string>& known);

}  // namespace loom
