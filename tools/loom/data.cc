// loom data prepare: tokenizes text ahead of training. Splits the input into training and
// validation text exactly as loom train does for raw text (every val_every-th .txt file by sorted
// name, or a single file's last 10%), trains a SentencePiece BPE tokenizer of --vocab-size pieces
// on the training text (--vocab-size 256: byte-level tokens, nothing to train), and writes to
// --out:
//   train.bin, val.bin   token shards (shard.h)
//   tokenizer.model      the SentencePiece model (absent for byte-level), or
//   tokenizer.json       with --tokenizer: a pretrained model's (copied; nothing is trained)
//   meta.json            vocab_size, tokenizer kind, token counts, source files
// `[data] path = "<out>"` then trains on the shards; loom sample decodes with the tokenizer file.
//
// Invariant: meta.json is written last, so a directory with meta.json is complete (each file is
// itself written atomically); loom train only reads a directory that has it.
#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/data/shard.h"
#include "loom/data/text_corpus.h"
#include "loom/tokenizer/tokenizer.h"

namespace loom::cli {

namespace fs = std::filesystem;

std::function<int()> add_data(CLI::App& app) {
  struct Opts {
    std::string input, out, tokenizer;
    int vocab_size = 0;
    int val_every = 10;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* d = app.add_subcommand("data", "prepare training data");
  d->require_subcommand(1);
  CLI::App* p = d->add_subcommand(
      "prepare", "train a tokenizer on text and write token shards for loom train");
  p->add_option("--input", o->input, "a text file or a directory of .txt files")->required();
  p->add_option("--out", o->out, "output directory (then [data] path = it)")->required();
  auto* vs = p->add_option("--vocab-size", o->vocab_size,
                           "tokenizer vocabulary: 256 = byte-level, more = SentencePiece BPE");
  p->add_option("--tokenizer", o->tokenizer,
                "a pretrained model's tokenizer.json (or its directory) instead of training one")
      ->excludes(vs);
  p->add_option("--val-every", o->val_every, "hold out every n-th file (sorted) for validation")
      ->capture_default_str()
      ->check(whole_number(1, 1 << 20));
  return [o]() {
    const bool pretrained = !o->tokenizer.empty();
    if (!pretrained && o->vocab_size == 0)
      throw Error(
          "loom data prepare: give --vocab-size (a tokenizer to train) or --tokenizer (a "
          "pretrained model's tokenizer.json)");
    if (!pretrained && o->vocab_size < 256)
      throw Error(fmt::format("--vocab-size {} is too small", o->vocab_size),
                  "256 gives byte-level tokens; a BPE vocabulary needs more than 256 (its byte "
                  "pieces come first)");
    std::error_code ec;
    std::string given = o->tokenizer;  // --tokenizer: the file, or a model directory holding it
    if (pretrained && fs::is_directory(given, ec)) given += "/tokenizer.json";
    if (pretrained && !fs::is_regular_file(given, ec))
      throw Error(fmt::format("--tokenizer {}: no such file", given),
                  "give a tokenizer.json, or a Hugging Face model directory holding one");
    // read before anything is written: an error names the given file and leaves --out as it was
    data::Tokenizer tok = pretrained ? data::Tokenizer::load(given) : data::Tokenizer::byte_level();
    data::TextSplit split = data::split_text(o->input, o->val_every);
    if (split.val.empty())
      throw Error(fmt::format("data {}: the validation text is empty", o->input),
                  "give more text, or more files");
    fs::create_directories(o->out, ec);
    if (ec) throw Error(fmt::format("--out {}: cannot create ({})", o->out, ec.message()));
    // an older meta.json would vouch for shards this run is about to replace
    fs::remove(o->out + "/meta.json", ec);

    const bool bytes = !pretrained && o->vocab_size == 256;
    const std::string model = o->out + "/tokenizer.model", json = o->out + "/tokenizer.json";
    for (const std::string& old : {model, o->out + "/tokenizer.vocab", json}) fs::remove(old, ec);
    std::string kind = "byte", file;
    if (pretrained) {
      // the data keeps its copy (loom train copies it into the run, loom sample reads it)
      write_file_atomic(json, read_file(given));
      kind = "hf-bpe", file = "tokenizer.json";
    } else if (!bytes) {
      fmt::print(stderr, "training a BPE tokenizer of {} pieces on {} bytes\n", o->vocab_size,
                 split.train.size());
      // SentencePiece writes prefix.model non-atomically: train beside it, then rename
      const std::string prefix = o->out + "/tokenizer.tmp";
      data::Tokenizer::train_bpe(split.train, o->vocab_size, prefix, o->input);
      fs::rename(prefix + ".model", model, ec);
      if (ec)
        throw Error(fmt::format("cannot rename {}.model to {}: {}", prefix, model, ec.message()));
      fs::rename(prefix + ".vocab", o->out + "/tokenizer.vocab", ec);
      kind = "sentencepiece-bpe", file = "tokenizer.model";
    }
    if (!pretrained && !bytes) tok = data::Tokenizer::load(model);  // the one just trained
    if (pretrained) o->vocab_size = tok.vocab_size();
    if (tok.vocab_size() != o->vocab_size)
      throw Error(fmt::format("{}: {} pieces, not the {} asked for", model, tok.vocab_size(),
                              o->vocab_size));
    auto train = tok.encode(split.train);
    auto val = tok.encode(split.val);
    data::write_shard(o->out + "/train.bin", train, o->vocab_size);
    data::write_shard(o->out + "/val.bin", val, o->vocab_size);
    nlohmann::json meta{{"format", "loom-data"},
                        {"version", 1},
                        {"vocab_size", o->vocab_size},
                        {"tokenizer", kind},
                        {"train_tokens", train.size()},
                        {"val_tokens", val.size()},
                        {"train_bytes", split.train.size()},
                        {"val_bytes", split.val.size()},
                        {"input", o->input},
                        {"train_files", split.train_files},
                        {"val_files", split.val_files}};
    if (!file.empty()) meta["tokenizer_model"] = file;
    write_file_atomic(o->out + "/meta.json", meta.dump(2) + "\n");  // last: marks DIR complete
    fmt::print("{}: {} training and {} validation tokens ({:.2f} bytes per token), vocab {}\n",
               o->out, train.size(), val.size(),
               double(split.train.size()) / double(std::max<size_t>(1, train.size())),
               o->vocab_size);
    return 0;
  };
}

}  // namespace loom::cli
