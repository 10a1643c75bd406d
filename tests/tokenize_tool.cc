// Encodes text with a Loom tokenizer and prints the ids as JSON, for tests that compare Loom's
// tokenizers with another implementation (tests/hf_tokenizer_test.py against `tokenizers`):
//   tokenize_tool TOKENIZER FILE lines   one JSON array per line of FILE (the line without its
//   "\n") tokenize_tool TOKENIZER FILE whole   one JSON array for the whole file
// and checks decode(encode(x)) == x for each, exiting 1 naming the line where it is not.
#include <fmt/format.h>

#include <iostream>
#include <sstream>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/tokenizer/tokenizer.h"

int main(int argc, char** argv) try {
  if (argc != 4 || (std::string(argv[3]) != "lines" && std::string(argv[3]) != "whole")) {
    std::cerr << "usage: tokenize_tool TOKENIZER FILE lines|whole\n";
    return 2;
  }
  const auto tok = loom::data::Tokenizer::load(argv[1]);
  const std::string text = loom::read_file(argv[2]);
  std::vector<std::string> parts;
  if (std::string(argv[3]) == "whole") {
    parts.push_back(text);
  } else {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) parts.push_back(line);
  }
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::vector<int32_t> ids = tok.encode(parts[i]);
    if (tok.decode(ids) != parts[i]) {
      std::cerr << fmt::format("{}: line {}: decode(encode(line)) differs from the line\n", argv[2],
                               i + 1);
      return 1;
    }
    out += fmt::format("[{}]\n", fmt::join(ids, ","));
  }
  std::cout << out;
  return 0;
} catch (const loom::Error& e) {
  std::cerr << "tokenize_tool: " << e.what() << "\n";
  return 1;
}
