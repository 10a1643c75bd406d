#include "loom/outer/config_section.h"

#include "loom/config/schema.h"

namespace loom::outer {

const char* outer_mode_name(OuterMode m) { return m == OuterMode::sync ? "sync" : "async"; }

namespace {

void check(OuterConfig& c, const config::Fail& fail) {
  if (c.mode == OuterMode::async && (c.fragments > 1 || c.overlap > 0 || c.mix > 0))
    fail(c.fragments > 1 ? "[outer] fragments"
         : c.overlap > 0 ? "[outer] overlap"
                         : "[outer] mix",
         "streaming DiLoCo needs [outer] mode = \"sync\"");
  if (c.inner_steps % c.fragments != 0)
    fail("[outer] fragments",
         fmt::format("must divide [outer] inner_steps = {} (one fragment is pushed every "
                     "inner_steps / fragments steps), got {}",
                     c.inner_steps, c.fragments));
  if (c.overlap > 0 && c.overlap >= c.inner_steps / c.fragments)
    fail("[outer] overlap",
         fmt::format("must be less than [outer] inner_steps / fragments = {} (one fragment in "
                     "flight at a time), got {}",
                     c.inner_steps / c.fragments, c.overlap));
  if (c.dipaco.enabled()) {
    const char* rule = "DiPaCo ([outer] modules) needs mode = \"sync\", one fragment, no overlap";
    if (c.mode != OuterMode::sync) fail("[outer] mode", rule);
    if (c.fragments != 1) fail("[outer] fragments", rule);
    if (c.overlap != 0) fail("[outer] overlap", rule);
  }
  dipaco::check_paths(c.dipaco, fail);
}

}  // namespace

const config::Section<OuterConfig>& outer_section() {
  using namespace config;
  using O = OuterConfig;
  static const Section<O> s = [] {
    Section<O> s{
        "outer",
        {
            string_key("server", &O::server,
                       "host:port of `loom outer-server`; set, `loom train` runs as an island"),
            enum_key("mode", &O::mode, {OuterMode::sync, OuterMode::async}, outer_mode_name,
                     "DiLoCo's rounds, or Delayed Nesterov"),
            string_choice_key("compress", &O::compress, {"f32", "bf16", "int8", "int4"},
                              "pseudo-gradients pushed as (int8, int4: a scale per block of 64; "
                              "the server sums in f32)"),
            // H travels to and from the outer server as a u32
            int_key("inner_steps", &O::inner_steps, closed(1, std::ldexp(1.0, 31) - 1),
                    "H, inner steps between pushes"),
            float_key("lr", &O::lr, {0, 1e3, true, false}, "the outer Nesterov learning rate"),
            float_key("momentum", &O::momentum, below_one(), ""),
            int_key("fragments", &O::fragments, closed(1, 4096),
                    "streaming DiLoCo: the model's fragments (strided by layer), each synced "
                    "every inner_steps at staggered offsets (sync mode)"),
            int_key("overlap", &O::overlap, at_least(0),
                    "streaming DiLoCo: inner steps an island goes on after pushing a fragment "
                    "before it takes the round's result (less than inner_steps / fragments)"),
            float_key("mix", &O::mix, closed(0, 1),
                      "streaming DiLoCo: a fragment's parameters after its round: mix x local + "
                      "(1 - mix) x global (0: the global ones)"),
        },
        check};
    for (const Key<dipaco::PathsConfig>& k : dipaco::path_keys())
      s.keys.push_back(lift<O>(k, &O::dipaco));
    const std::vector<Key<O>> rest = {
        int_key("delay", &O::delay, closed(0, 65536),
                "async Delayed Nesterov period in pushes (0: the islands that are members at each "
                "push, and a period also closes when an island of it pushes again: one beat)"),
        bool_key("yield", &O::yield,
                 "async: from a push until the island takes its period, its inner steps run at "
                 "idle CPU priority (cores it shares go to the islands still on their way to the "
                 "beat; not with a [plan])"),
        int_key("islands", &O::islands, closed(0, 65536),
                "islands expected (the first round waits for them; async step budget)"),
        // durations become clock ticks (nanoseconds in int64: at most 292 years); a day is plenty
        float_key("lease_s", &O::lease_s, {0, 86400, true, false},
                  "an island silent this long is dropped", config::Used::f64),
        float_key("retry_s", &O::retry_s, closed(0, 86400), "how long an island keeps reconnecting",
                  config::Used::f64),
        string_key("token_file", &O::token_file,
                   "a file holding the shared token (else `LOOM_OUTER_TOKEN`)"),
        string_key("tls_ca", &O::tls_ca, "island: the PEM certificate to trust"),
        string_key("tls_cert", &O::tls_cert, "server: its PEM certificate (with tls_key)"),
        string_key("tls_key", &O::tls_key, "server: its PEM private key (with tls_cert)"),
    };
    s.keys.insert(s.keys.end(), rest.begin(), rest.end());
    return s;
  }();
  return s;
}

}  // namespace loom::outer
