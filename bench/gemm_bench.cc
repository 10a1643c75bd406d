// GEMM throughput at the transformer training shapes of the benchmark model, one JSON line per run.
//
// Model: T = 2048 token rows per step, C = 512, ffn 1408, V = 8192. For a weight W (out,in) the
// training step runs three GEMMs:
//   forward   y  = x · Wᵀ   M = 2048, K = in,  N = out   (tb: W is stored (out,in))
//   backward  dx = dy · W   M = 2048, K = out, N = in
//   backward  dW = dyᵀ · x  M = out,  K = 2048, N = in  (ta: dy is stored (2048,out))
// each in f32 -> f32, bf16 -> f32 and bf16 -> bf16. GFLOP/s = 2·M·N·K / median time of --reps runs
// after --warmup runs; the fastest run is printed too, being the figure least disturbed when other
// processes share the cores.
//
// The "gemm_pack" lines answer whether pre-packing the weight operand pays: oneDNN picks its
// preferred (blocked) layout for B given format_tag::any; we time the GEMM on the packed B and the
// reorder that packs it, against the GEMM on plain B. A weight changes every step and each packed
// form feeds one GEMM per step (forward needs Wᵀ, backward W), so packing pays only if packed +
// reorder < plain.
//
// The "gemm_ta_copy" lines do the same for a transposed A: gemm with ta, against an explicit
// transpose of A (a oneDNN reorder) followed by the GEMM without ta.
//
// With --decode, instead: the matmuls of one decode step of SmolLM2-135M (M = 1 row; C = 576,
// ffn 1536, kv 192, V = 49152), each weight (N,K) as nn.Linear stores it, in f32 and bf16, cycled
// through enough copies (>= 512 MB) that every call reads its weight from memory, as a decode step
// does. Each "gemv" line times loom's gemm (bf16: gemv.h), oneDNN's matmul on the plain weight and
// on the weight packed once into its preferred layout, interleaved, in GB/s of weight read; a
// "stream" line gives the machine's read bandwidth (a sum over 512 MB, same threads); --stream 1
// prints that line alone (bench/sample_bench.py's bandwidth floor).
//
// Usage: gemm_bench [--threads 2] [--reps 20] [--warmup 3] [--only bwd_dw] [--decode 1]
// [--stream 1]. Timings are never asserted.
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dnnl.hpp"
#include "loom/kernels/cpu/gemm.h"

namespace {

using loom::DType;
using loom::kernels::cpu::GemmDesc;

struct Shape {
  const char* name;
  int64_t M, N, K;
  bool ta, tb;
  bool b_is_weight;  // B is a weight (the packing question applies)
};

constexpr int64_t kT = 2048, kC = 512, kF = 1408, kV = 8192;

const Shape kShapes[] = {
    {"fwd_attn x.Wt (C->C)", kT, kC, kC, false, true, true},
    {"fwd_ffn_up x.Wt (C->F)", kT, kF, kC, false, true, true},
    {"fwd_ffn_down x.Wt (F->C)", kT, kC, kF, false, true, true},
    {"fwd_lm_head x.Wt (C->V)", kT, kV, kC, false, true, true},
    {"bwd_dx_attn dy.W (C->C)", kT, kC, kC, false, false, true},
    {"bwd_dx_ffn_up dy.W (C->F)", kT, kC, kF, false, false, true},
    {"bwd_dx_ffn_down dy.W (F->C)", kT, kF, kC, false, false, true},
    {"bwd_dx_lm_head dy.W (C->V)", kT, kC, kV, false, false, true},
    {"bwd_dw_attn dyt.x (C->C)", kC, kC, kT, true, false, false},
    {"bwd_dw_ffn_up dyt.x (C->F)", kF, kC, kT, true, false, false},
    {"bwd_dw_ffn_down dyt.x (F->C)", kC, kF, kT, true, false, false},
    {"bwd_dw_lm_head dyt.x (C->V)", kV, kC, kT, true, false, false},
};

struct DTypes {
  DType ab, c;
  const char* name;
};
const DTypes kDTypes[] = {{DType::f32, DType::f32, "f32"},
                          {DType::bf16, DType::f32, "bf16->f32"},
                          {DType::bf16, DType::bf16, "bf16"}};

// 64-byte aligned buffer filled with uniform [-1,1] values of the given dtype.
struct Buffer {
  void* p = nullptr;
  explicit Buffer(int64_t n, DType t, std::mt19937& rng) {
    const size_t bytes = (size_t(n) * loom::dtype_size(t) + 63) / 64 * 64;
    p = std::aligned_alloc(64, bytes);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < n; ++i) {
      if (t == DType::f32) {
        static_cast<float*>(p)[i] = u(rng);
      } else {
        static_cast<loom::bf16*>(p)[i] = loom::f32_to_bf16(u(rng));
      }
    }
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

struct Timing {
  double median_ms, min_ms;  // min is the figure least disturbed by other processes on shared cores
};

constexpr double kColdBytes = 512e6;  // past any cache: every read comes from memory

Timing time_ms(int warmup, int reps, const std::function<void()>& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> ms(reps);
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms[i] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  std::sort(ms.begin(), ms.end());
  return {ms[reps / 2], ms[0]};
}

// Times the GEMM with B in oneDNN's preferred layout (format_tag::any) and the reorder into it,
// against loom's gemm on plain B. The three run interleaved within each rep so that they see the

// Runs the three steps in turn, warmup + reps times, so that all three see the same machine load;
// returns each one's median and fastest time.
std::array<Timing, 3> time_interleaved(const std::function<void()> (&steps)[3], int warmup,
                                       int reps) {
  std::vector<double> ms[3];
  for (int i = 0; i < warmup + reps; ++i) {
    for (int k = 0; k < 3; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      steps[k]();
      const auto t1 = std::chrono::steady_clock::now();
      if (i >= warmup) ms[k].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  }
  std::array<Timing, 3> tm;
  for (int k = 0; k < 3; ++k) {
    std::sort(ms[k].begin(), ms[k].end());
    tm[size_t(k)] = {ms[k][size_t(reps / 2)], ms[k][0]};
  }
  return tm;
}

// same load.
void bench_packing(const Shape& s, const DTypes& t, const GemmDesc& d, const void* a, const void* b,
                   void* c, int warmup, int reps, int threads) {
  using dnnl::memory;
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const auto dt = [](DType x) {
    return x == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  };
  const memory::desc a_md({s.M, s.K}, dt(t.ab), s.ta ? memory::dims{1, s.M} : memory::dims{s.K, 1});
  const memory::desc b_plain({s.K, s.N}, dt(t.ab),
                             s.tb ? memory::dims{1, s.K} : memory::dims{s.N, 1});
  const memory::desc b_any({s.K, s.N}, dt(t.ab), memory::format_tag::any);
  const memory::desc c_md({s.M, s.N}, dt(t.c), memory::dims{s.N, 1});
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_any, c_md), eng);
  const memory::desc b_packed = pd.weights_desc();
  memory a_mem(a_md, eng, const_cast<void*>(a)), c_mem(c_md, eng, c);
  memory b_src(b_plain, eng, const_cast<void*>(b)), b_dst(b_packed, eng);
  dnnl::reorder pack(b_src, b_dst);
  dnnl::matmul mm(pd);
  const std::function<void()> steps[3] = {
      [&] { loom::kernels::cpu::gemm(d, a, b, c); },
      [&] {
        pack.execute(stream, b_src, b_dst);
        stream.wait();
      },
      [&] {
        mm.execute(stream,
                   {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_dst}, {DNNL_ARG_DST, c_mem}});
        stream.wait();
      }};
  const std::array<Timing, 3> tm = time_interleaved(steps, warmup, reps);
  std::printf(
      "{\"bench\":\"gemm_pack\",\"shape\":\"%s\",\"M\":%ld,\"N\":%ld,\"K\":%ld,\"ta\":%d,\"tb\":%d,"
      "\"dtype\":\"%s\",\"threads\":%d,\"layout_differs\":%s,\"plain_ms\":%.3f,\"packed_ms\":%.3f,"
      "\"reorder_ms\":%.3f,\"plain_min_ms\":%.3f,\"packed_min_ms\":%.3f,\"reorder_min_ms\":%.3f}\n",
      s.name, long(s.M), long(s.N), long(s.K), s.ta, s.tb, t.name, threads,
      b_packed == b_plain ? "false" : "true", tm[0].median_ms, tm[2].median_ms, tm[1].median_ms,
      tm[0].min_ms, tm[2].min_ms, tm[1].min_ms);
}

// For a transposed A (the dW GEMMs) times loom's gemm with ta against the alternative that gemm.cc
// deliberately does not take: a oneDNN reorder of A into row-major (M,K), then the GEMM without ta.
// Interleaved within each rep, like bench_packing.
void bench_transposed_a(const Shape& s, const DTypes& t, const GemmDesc& d, const void* a,
                        const void* b, void* c, int warmup, int reps, int threads) {
  using dnnl::memory;
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const auto dt = t.ab == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  const memory::desc a_ta({s.M, s.K}, dt, memory::dims{1, s.M});
  const memory::desc a_rowmajor({s.M, s.K}, dt, memory::dims{s.K, 1});
  memory a_src(a_ta, eng, const_cast<void*>(a)), a_dst(a_rowmajor, eng);
  dnnl::reorder transpose(a_src, a_dst);
  GemmDesc plain = d;
  plain.ta = false;
  const std::function<void()> steps[3] = {
      [&] { loom::kernels::cpu::gemm(d, a, b, c); },
      [&] {
        transpose.execute(stream, a_src, a_dst);
        stream.wait();
      },
      [&] { loom::kernels::cpu::gemm(plain, a_dst.get_data_handle(), b, c); }};
  const std::array<Timing, 3> tm = time_interleaved(steps, warmup, reps);
  std::printf(
      "{\"bench\":\"gemm_ta_copy\",\"shape\":\"%s\",\"M\":%ld,\"N\":%ld,\"K\":%ld,"
      "\"dtype\":\"%s\",\"threads\":%d,\"ta_ms\":%.3f,\"transpose_ms\":%.3f,\"plain_ms\":%.3f,"
      "\"ta_min_ms\":%.3f,\"transpose_min_ms\":%.3f,\"plain_min_ms\":%.3f}\n",
      s.name, long(s.M), long(s.N), long(s.K), t.name, threads, tm[0].median_ms, tm[1].median_ms,
      tm[2].median_ms, tm[0].min_ms, tm[1].min_ms, tm[2].min_ms);
}

// The machine's read bandwidth: 16 independent sums per thread over 512 MB of f32 (a "stream"
// line).
void bench_stream(int reps, int threads) {
  const int64_t n = int64_t(kColdBytes / 4);
  std::mt19937 rng(1);
  Buffer x(n, DType::f32, rng);
  const float* xp = static_cast<const float*>(x.p);
  const Timing tm = time_ms(1, std::max(3, reps / 4), [&] {
    float total = 0;
#pragma omp parallel for reduction(+ : total) schedule(static)
    for (int64_t b = 0; b < n / 4096; ++b) {
      float acc[16] = {};
      for (int64_t i = b * 4096; i < (b + 1) * 4096; i += 16)
#pragma omp simd
        for (int l = 0; l < 16; ++l) acc[l] += xp[i + l];
      for (float v : acc) total += v;
    }
    if (total == 12345.f) std::printf("#\n");  // keeps the sum
  });
  std::printf(
      "{\"bench\":\"stream\",\"bytes\":%ld,\"threads\":%d,\"ms\":%.2f,\"gb_s\":%.1f,"
      "\"gb_s_at_min\":%.1f}\n",
      long(n * 4), threads, tm.median_ms, double(n * 4) / tm.median_ms / 1e6,
      double(n * 4) / tm.min_ms / 1e6);
}

// --decode: see the header.
void bench_decode(int warmup, int reps, int threads) {
  using dnnl::memory;
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  constexpr int64_t C = 576, F = 1536, KV = 192, V = 49152;
  const Shape shapes[] = {{"q,o (C->C)", 1, C, C, false, true, true},
                          {"k,v (C->kv)", 1, KV, C, false, true, true},
                          {"gate,up (C->F)", 1, F, C, false, true, true},
                          {"down (F->C)", 1, C, F, false, true, true},
                          {"head (C->V)", 1, V, C, false, true, true}};
  std::mt19937 rng(1);
  for (const Shape& s : shapes) {
    for (DType t : {DType::f32, DType::bf16}) {
      const GemmDesc d{.M = 1, .N = s.N, .K = s.K, .tb = true, .ab_dtype = t};
      const int64_t wbytes = s.N * s.K * int64_t(loom::dtype_size(t));
      const int copies = int(kColdBytes / double(wbytes)) + 1;
      const auto dt = t == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32;
      const memory::desc a_md({1, s.K}, dt, memory::dims{s.K, 1});
      const memory::desc b_plain({s.K, s.N}, dt, memory::dims{1, s.K});
      const memory::desc b_any({s.K, s.N}, dt, memory::format_tag::any);
      const memory::desc c_md({1, s.N}, memory::data_type::f32, memory::dims{s.N, 1});
      const dnnl::matmul::primitive_desc plain_pd(dnnl::matmul::desc(a_md, b_plain, c_md), eng),
          packed_pd(dnnl::matmul::desc(a_md, b_any, c_md), eng);
      dnnl::matmul plain_mm(plain_pd), packed_mm(packed_pd);
      Buffer a(s.K, t, rng), c(s.N, DType::f32, rng);
      std::vector<std::unique_ptr<Buffer>> ws;
      std::vector<memory> packed;
      for (int i = 0; i < copies; ++i) {
        ws.push_back(std::make_unique<Buffer>(s.N * s.K, t, rng));
        memory src(b_plain, eng, ws.back()->p), dst(packed_pd.weights_desc(), eng);
        dnnl::reorder(src, dst).execute(stream, src, dst);
        packed.push_back(dst);
      }
      stream.wait();
      memory a_mem(a_md, eng, a.p), c_mem(c_md, eng, c.p);
      // each variant walks the copies on its own; the two on plain weights half the copies apart,
      // so neither reads what the other has just brought into the caches
      int next[3] = {0, copies / 2, 0};
      const std::function<void()> steps[3] = {
          [&] { loom::kernels::cpu::gemm(d, a.p, ws[size_t(next[0]++ % copies)]->p, c.p); },
          [&] {
            memory b(b_plain, eng, ws[size_t(next[1]++ % copies)]->p);
            plain_mm.execute(stream,
                             {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c_mem}});
            stream.wait();
          },
          [&] {
            packed_mm.execute(stream, {{DNNL_ARG_SRC, a_mem},
                                       {DNNL_ARG_WEIGHTS, packed[size_t(next[2]++ % copies)]},
                                       {DNNL_ARG_DST, c_mem}});
            stream.wait();
          }};
      const std::array<Timing, 3> tm = time_interleaved(steps, warmup, reps);
      const auto gbs = [&](double ms) { return double(wbytes) / ms / 1e6; };
      std::printf(
          "{\"bench\":\"gemv\",\"shape\":\"%s\",\"N\":%ld,\"K\":%ld,\"dtype\":\"%s\","
          "\"threads\":%d,\"weight_bytes\":%ld,\"loom_us\":%.1f,\"onednn_plain_us\":%.1f,"
          "\"onednn_packed_us\":%.1f,\"loom_gb_s\":%.1f,\"onednn_plain_gb_s\":%.1f,"
          "\"onednn_packed_gb_s\":%.1f}\n",
          s.name, long(s.N), long(s.K), loom::dtype_name(t).data(), threads, long(wbytes),
          tm[0].median_ms * 1e3, tm[1].median_ms * 1e3, tm[2].median_ms * 1e3, gbs(tm[0].median_ms),
          gbs(tm[1].median_ms), gbs(tm[2].median_ms));
      std::fflush(stdout);
    }
  }
  bench_stream(reps, threads);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 20, warmup = 3;
  bool decode = false, stream = false;
  std::string only;  // run only shapes whose name contains this
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (flag == "--decode") {
      decode = v != 0;
    } else if (flag == "--stream") {
      stream = v != 0;
    } else if (flag == "--only") {
      only = argv[i + 1];
    } else if (flag == "--threads") {
      threads = v;
    } else if (flag == "--reps") {
      reps = v;
    } else if (flag == "--warmup") {
      warmup = v;
    } else {
      std::fprintf(
          stderr,
          "gemm_bench: unknown flag %s\nhint: --threads N --reps N --warmup N --only NAME_PART "
          "--decode 1 --stream 1\n",
          flag.c_str());
      return 2;
    }
  }
  if (threads < 1 || reps < 1 || warmup < 0) {
    std::fprintf(stderr, "gemm_bench: --threads and --reps must be >= 1, --warmup >= 0\n");
    return 2;
  }
  omp_set_num_threads(threads);
  if (stream) {
    bench_stream(reps, threads);
    return 0;
  }
  if (decode) {
    bench_decode(warmup, reps, threads);
    return 0;
  }
  std::mt19937 rng(1);
  for (const Shape& s : kShapes) {
    if (std::string(s.name).find(only) == std::string::npos) continue;
    for (const DTypes& t : kDTypes) {
      const GemmDesc d{
          .M = s.M, .N = s.N, .K = s.K, .ta = s.ta, .tb = s.tb, .ab_dtype = t.ab, .c_dtype = t.c};
      Buffer a(s.M * s.K, t.ab, rng), b(s.K * s.N, t.ab, rng), c(s.M * s.N, t.c, rng);
      const Timing ms = time_ms(warmup, reps, [&] { loom::kernels::cpu::gemm(d, a.p, b.p, c.p); });
      const double gflop = 2.0 * s.M * s.N * s.K / 1e9;
      std::printf(
          "{\"bench\":\"gemm\",\"shape\":\"%s\",\"M\":%ld,\"N\":%ld,\"K\":%ld,\"ta\":%d,\"tb\":%d,"
          "\"dtype\":\"%s\",\"threads\":%d,\"ms\":%.3f,\"gflops\":%.1f,\"min_ms\":%.3f,"
          "\"gflops_at_min\":%.1f}\n",
          s.name, long(s.M), long(s.N), long(s.K), s.ta, s.tb, t.name, threads, ms.median_ms,
          gflop / ms.median_ms * 1e3, ms.min_ms, gflop / ms.min_ms * 1e3);
      if (s.b_is_weight && t.ab == DType::bf16) {
        bench_packing(s, t, d, a.p, b.p, c.p, warmup, reps, threads);
      }
      if (s.ta) bench_transposed_a(s, t, d, a.p, b.p, c.p, warmup, reps, threads);
      std::fflush(stdout);
    }
  }
  return 0;
}
