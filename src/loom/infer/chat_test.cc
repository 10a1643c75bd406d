// A model's chat files read, and the templates in use rendered as Jinja renders them for one user
// message with the generation prompt (the expected strings are transformers' apply_chat_template
// output for these templates); templates it does not recognise refused.
#include "loom/infer/chat.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "loom/core/error.h"
#include "loom/core/testing.h"

namespace loom::infer {
namespace {

// SmolLM2-Instruct's chat_template.jinja, as transformers saves it (its newlines are characters)
const char* kSmolLM2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";

// Qwen2's, with Jinja's \n escapes (as tokenizer_config.json's JSON string decodes to)
const char* kQwen2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif "
    "%}{{'<|im_start|>' "
    "+ message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
    "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Meta Llama 3's
const char* kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% "
    "endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

ChatFiles with(const char* tmpl) {
  ChatFiles c;
  c.chat_template = tmpl;
  c.template_file = "tokenizer_config.json";
  c.bos_token = "<|begin_of_text|>";
  return c;
}

TEST(Chat, ChatMLWithTheTemplatesDefaultSystemMessage) {
  EXPECT_EQ(apply_chat_template(with(kSmolLM2), "What is 2+2?"),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(apply_chat_template(with(kQwen2), "Hi"),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
            "Hi<|im_end|>\n<|im_start|>assistant\n");
  // a ChatML template that writes no system message of its own
  EXPECT_EQ(apply_chat_template(with("{% for message in messages %}{{'<|im_start|>' + "
                                     "message['role'] + '\\n' + message['content'] + "
                                     "'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt "
                                     "%}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
                                "Hi"),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(Chat, Llama3BeginsWithBosAndTrimsTheMessage) {
  EXPECT_EQ(apply_chat_template(with(kLlama3), "  Hello there \n"),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello "
            "there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(Chat, TemplatesItCannotRenderAreRefusedNamingTheFile) {
  auto error_of = [](const std::string& tmpl) -> std::string {
    ChatFiles c = with("");
    c.chat_template = tmpl;
    return loom::error_of([&] { apply_chat_template(c, "hi"); });
  };
  EXPECT_NE(error_of("").find("no chat template"), std::string::npos);
  EXPECT_NE(error_of("{{ '[INST] ' + messages[0]['content'] + ' [/INST]' }}")
                .find("tokenizer_config.json is neither ChatML nor Llama 3's"),
            std::string::npos);
  // Llama 3.1's dated system header
  EXPECT_NE(
      error_of(std::string(kLlama3) + "Cutting Knowledge Date: December 2023").find("neither"),
      std::string::npos);
}

struct Dir {
  std::string path =
      (std::filesystem::temp_directory_path() / ("loom_chat_" + std::to_string(::getpid())))
          .string();
  Dir() { std::filesystem::create_directories(path); }
  ~Dir() { std::filesystem::remove_all(path); }
  void put(const std::string& name, const std::string& text) const {
    std::ofstream(path + "/" + name) << text;
  }
};

TEST(Chat, FilesGiveTheStopIdsAndTheTemplate) {
  const Dir d;
  const data::Tokenizer bytes = data::Tokenizer::byte_level();
  EXPECT_TRUE(read_chat_files(d.path, bytes, 256).stop_ids.empty());  // nothing there: nothing
  d.put("config.json", R"({"eos_token_id": 7})");
  EXPECT_EQ(read_chat_files(d.path, bytes, 256).stop_ids, std::vector<int32_t>{7});
  d.put("generation_config.json", R"({"eos_token_id": [9, 2, 9]})");  // before config.json's
  d.put("chat_template.jinja", kSmolLM2);
  d.put("tokenizer_config.json", R"({"eos_token": {"content": "<|im_end|>"}, "bos_token": "<s>"})");
  const ChatFiles c = read_chat_files(d.path, bytes, 256);
  EXPECT_EQ(c.stop_ids, (std::vector<int32_t>{2, 9}));
  EXPECT_EQ(c.chat_template, kSmolLM2);
  EXPECT_EQ(c.template_file, d.path + "/chat_template.jinja");
  EXPECT_EQ(c.bos_token, "<s>");
  d.put("tokenizer_config.json", R"({"chat_template": [{"name": "default", "template": "T"}]})");
  EXPECT_EQ(read_chat_files(d.path, bytes, 256).chat_template, "T");  // before chat_template.jinja
  d.put("generation_config.json", R"({"eos_token_id": "two"})");
  const std::string e = error_of([&] { read_chat_files(d.path, bytes, 256); });
  EXPECT_NE(e.find("generation_config.json: eos_token_id"), std::string::npos)
      << "a bad eos_token_id: " << e;
  // what would never end a reply, or hides a type error, is refused naming the file
  const std::vector<std::pair<std::pair<const char*, const char*>, const char*>> bad = {
      {{"generation_config.json", R"({"eos_token_id": 256})"},
       "generation_config.json: eos_token_id: expected a token id of the model's vocabulary [0, "
       "256)"},
      {{"generation_config.json", "[1]"}, "generation_config.json: expected a JSON object"},
  };
  for (const auto& [file, want] : bad) {
    d.put(file.first, file.second);
    const std::string got = error_of([&] { read_chat_files(d.path, bytes, 256); });
    EXPECT_NE(got.find(want), std::string::npos) << got;
  }
  d.put("generation_config.json", "{}");
  d.put("tokenizer_config.json", R"({"chat_template": [{"name": "default", "template": 5}]})");
  const std::string t = error_of([&] { read_chat_files(d.path, bytes, 256); });
  EXPECT_NE(t.find("chat_template: each of the list's entries must be"), std::string::npos) << t;
}

}  // namespace
}  // namespace loom::infer
