// A Hugging Face tokenizer.json (a pretrained model's, `[data] tokenizer` or beside `[model]
// init`): loaded, then a text with ASCII, multi-byte characters and an added-token-like span
// encoded and decoded back.
#include "fuzz/fuzz.h"
#include "loom/tokenizer/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = loom::fuzz::put_file("tokenizer.json", loom::fuzz::as_text(data, size));
  loom::fuzz::guard([&] {
    const auto t = loom::data::HfTokenizer::load(path);
    const auto ids = t->encode("Hello, w\xc3\xb6rld! <|endoftext|> 12  \n\tx\xe2\x82\xac");
    for (int32_t id : ids)
      if (id < 0 || id >= t->vocab_size()) std::abort();
    (void)t->decode(ids);
  });
  return 0;
}
