#include "loom/infer/chat.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>

#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom::infer {

namespace {

// `dir`/`name` as JSON, or null when it is not there.
nlohmann::json json_file(const std::string& dir, const char* name) {
  const std::string path = dir + "/" + name;
  return path_exists(path) ? read_json(path) : nlohmann::json();
}

// eos_token_id as the files hold it: a number or a list of numbers, each an id of the model's
// `vocab`.
void add_ids(const nlohmann::json& doc, const std::string& file, int64_t vocab,
             std::vector<int32_t>& out) {
  if (!doc.is_object() || !doc.contains("eos_token_id") || doc["eos_token_id"].is_null()) return;
  const nlohmann::json& v = doc["eos_token_id"];
  const auto one = [&](const nlohmann::json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab)
      throw Error(
          fmt::format("{}: eos_token_id: expected a token id of the model's vocabulary "
                      "[0, {}) or a list of them, got {}",
                      file, vocab, v.dump()));
    out.push_back(int32_t(x.get<int64_t>()));
  };
  if (v.is_array())
    for (const auto& x : v) one(x);
  else
    one(v);
}

// A special token as tokenizer_config.json holds it: its text, or {"content": text, ...}.
std::string token_text(const nlohmann::json& doc, const char* key, const std::string& file) {
  if (!doc.is_object() || !doc.contains(key) || doc[key].is_null()) return "";
  const nlohmann::json& v = doc[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  throw Error(fmt::format("{}: {}: expected the token's text, got {}", file, key, v.dump()));
}

// The literal text after `open` up to `close` in a template, where it is a literal (no quote, no
// expression), with Jinja's \n escapes made newlines; empty when there is none.
std::string literal_after(const std::string& tmpl, const std::string& open,
                          const std::string& close) {
  for (size_t at = tmpl.find(open); at != std::string::npos; at = tmpl.find(open, at + 1)) {
    const size_t from = at + open.size();
    const size_t to = tmpl.find(close, from);
    if (to == std::string::npos) return "";
    const std::string_view raw = std::string_view(tmpl).substr(from, to - from);
    if (raw.find_first_of("'\"{}+") != std::string_view::npos) continue;  // not a literal
    std::string text;
    for (size_t i = 0; i < raw.size(); ++i) {
      const bool escape = raw[i] == '\\' && i + 1 < raw.size() && raw[i + 1] == 'n';
      text += escape ? '\n' : raw[i];
      i += escape;
    }
    return text;
  }
  return "";
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
}

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

}  // namespace

ChatFiles read_chat_files(const std::string& dir, const data::Tokenizer& tok, int64_t vocab) {
  ChatFiles c;
  if (dir.empty()) return c;
  const std::string gen_file = dir + "/generation_config.json";
  const nlohmann::json gen = json_file(dir, "generation_config.json");
  if (!gen.is_null() && !gen.is_object())
    throw Error(fmt::format("{}: expected a JSON object", gen_file));
  add_ids(gen, gen_file, vocab, c.stop_ids);
  if (c.stop_ids.empty())
    add_ids(json_file(dir, "config.json"), dir + "/config.json", vocab, c.stop_ids);
  const std::string tc_file = dir + "/tokenizer_config.json";
  const nlohmann::json tc = json_file(dir, "tokenizer_config.json");
  if (!tc.is_null() && !tc.is_object())
    throw Error(fmt::format("{}: expected a JSON object", tc_file));
  if (const std::string eos = token_text(tc, "eos_token", tc_file);
      !eos.empty() && !tok.is_byte_level()) {
    const std::vector<int32_t> ids = tok.encode(eos);
    if (ids.size() != 1)  // not a special token of the vocabulary: it would never end a reply
      throw Error(
          fmt::format("{}: eos_token '{}' is {} tokens of the tokenizer, not one of its "
                      "vocabulary",
                      tc_file, eos, ids.size()));
    c.stop_ids.push_back(ids[0]);
  }
  std::sort(c.stop_ids.begin(), c.stop_ids.end());
  c.stop_ids.erase(std::unique(c.stop_ids.begin(), c.stop_ids.end()), c.stop_ids.end());
  c.bos_token = token_text(tc, "bos_token", tc_file);
  if (tc.is_object() && tc.contains("chat_template") && !tc["chat_template"].is_null()) {
    const nlohmann::json& t = tc["chat_template"];
    if (t.is_string()) {
      c.chat_template = t.get<std::string>();
    } else if (t.is_array()) {  // [{"name": ..., "template": ...}]: the default one
      for (const auto& e : t) {
        if (!e.is_object() || !e.contains("name") || !e["name"].is_string() ||
            !e.contains("template") || !e["template"].is_string())
          throw Error(
              fmt::format("{}: chat_template: each of the list's entries must be "
                          "{{\"name\": string, \"template\": string}}, got {}",
                          tc_file, e.dump()));
        if (e["name"] == "default") c.chat_template = e["template"].get<std::string>();
      }
    } else {
      throw Error(
          fmt::format("{}: chat_template: expected a string or a list of named "
                      "templates",
                      tc_file));
    }
    c.template_file = tc_file;
  }
  if (c.chat_template.empty() && path_exists(dir + "/chat_template.jinja")) {
    c.template_file = dir + "/chat_template.jinja";
    c.chat_template = read_file(c.template_file);
  }
  return c;
}

std::string apply_chat_template(const ChatFiles& c, const std::string& message) {
  const std::string& t = c.chat_template;
  if (t.empty())
    throw Error(
        "--chat: the model has no chat template (tokenizer_config.json's chat_template "
        "or chat_template.jinja)",
        "give the prompt as the model expects it with --prompt");
  if (contains(t, "<|im_start|>") && contains(t, "<|im_end|>") &&
      contains(t, "add_generation_prompt")) {
    // the system message the template writes for a conversation without one (its newline a
    // character of the file, or Jinja's \n)
    std::string sys = literal_after(t, "<|im_start|>system\n", "<|im_end|>");
    if (sys.empty()) sys = literal_after(t, "<|im_start|>system\\n", "<|im_end|>");
    const std::string head = sys.empty() ? "" : "<|im_start|>system\n" + sys + "<|im_end|>\n";
    return head + "<|im_start|>user\n" + message + "<|im_end|>\n<|im_start|>assistant\n";
  }
  if (contains(t, "<|start_header_id|>") && contains(t, "<|eot_id|>") &&
      !contains(t, "Cutting Knowledge") && !contains(t, "tools")) {
    return c.bos_token + "<|start_header_id|>user<|end_header_id|>\n\n" + trim(message) +
           "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
  }
  throw Error(fmt::format("--chat: the chat template of {} is neither ChatML nor Llama 3's; loom "
                          "sample renders only those (it has no Jinja engine)",
                          c.template_file),
              "render the conversation yourself and give it with --prompt");
}

}  // namespace loom::infer
