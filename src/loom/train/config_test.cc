// docs/config.md documents every config key: each "[section] key" of the schema (config_keys())
// appears there as `[section] key`, and every key the page documents is one the schema has.
#include "loom/train/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

namespace loom::train {
namespace {

TEST(ConfigDocs, EveryKeyIsDocumentedAndEveryDocumentedKeyExists) {
  std::ifstream in(std::string(LOOM_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md is missing";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  const std::vector<std::string> keys = config_keys();
  EXPECT_GT(keys.size(), 40u);
  for (const std::string& k : keys)
    EXPECT_NE(doc.find("`" + k + "`"), std::string::npos) << k << " is not in docs/config.md";
  const std::set<std::string> known(keys.begin(), keys.end());
  const std::regex row(R"(\| `(\[[a-z]+\] [a-z0-9_.]+)`)");
  int rows = 0;
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), row); it != std::sregex_iterator();
       ++it, ++rows)
    EXPECT_TRUE(known.count((*it)[1].str())) << (*it)[1].str() << " is no config key";
  EXPECT_EQ(rows, int(keys.size()));
}

}  // namespace
}  // namespace loom::train
