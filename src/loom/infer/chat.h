// A pretrained model's conversation conventions, from its Hugging Face files: the tokens that end a
// reply, and its chat template applied to a user's message (`loom sample --chat`).
//
// Stop ids: generation_config.json's eos_token_id (a number or a list), else config.json's, and
// tokenizer_config.json's eos_token (its text, encoded by the model's tokenizer to one id); the
// union of what is there. The chat template: tokenizer_config.json's chat_template (a string, or
// the list entry named "default"), else chat_template.jinja beside it.
//
// No Jinja engine fits the build (Debian packages none for C++), so the templates in use are
// recognised and rendered as the template would render one user message with
// add_generation_prompt: ChatML (`<|im_start|>ROLE\nTEXT<|im_end|>\n`; SmolLM2, Qwen), with the
// default system message a template writes when the conversation has none (its literal
// `<|im_start|>system\n...<|im_end|>` text), and Llama 3's (`bos_token` then
// `<|start_header_id|>ROLE<|end_header_id|>\n\nTEXT<|eot_id|>`, the message trimmed). Any other
// template, or a Llama 3.1-style one that writes a dated system header or tool instructions, is
// refused naming the file: the caller gives the formatted prompt with --prompt instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/tokenizer/tokenizer.h"

namespace loom::infer {

struct ChatFiles {
  std::vector<int32_t> stop_ids;  // sorted, unique
  std::string chat_template;      // empty: none
  std::string template_file;      // where it came from, for messages
  std::string bos_token;          // tokenizer_config.json's, for Llama 3's template
};

// The files in `dir` (a Hugging Face model directory, or a run's copy of its source's files); an
// absent directory or file gives nothing. Throws loom::Error naming the file for one that is not
// valid JSON or holds a key of the wrong kind, an end-of-turn id past the model's `vocab`, or an
// eos_token that is not one token of `tok`'s vocabulary (either would never end a reply).
ChatFiles read_chat_files(const std::string& dir, const data::Tokenizer& tok, int64_t vocab);

// `message` as the one user turn of a conversation, rendered by the template with the generation
// prompt (the text a model continues with its reply). Throws loom::Error naming `c.template_file`
// for a template it does not recognise, or none.
std::string apply_chat_template(const ChatFiles& c, const std::string& message);

}  // namespace loom::infer
