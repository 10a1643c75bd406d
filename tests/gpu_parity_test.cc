// The CUDA backend against the CPU engine (label `gpu`: needs a GPU; scripts/gpu_check.sh runs it).
//
//   Ops:    every op harness graph of tests/op_cases.h (each differentiable op's forward and its
//           VJP kernels) run by the executor on both devices with the same inputs: every output
//           within 1e-5 relative L2 in f32, 1e-2 where the graph holds bf16 values.
//   Sizes:  the kernels on odd and large shapes (GEMMs through cuBLASLt and the tiled kernel,
//   attention, cross-entropy over GPT-2's
//           vocabulary, norms, the embedding's gradient with repeated ids, long reductions, AdamW).
//   Steps:  StepRunner on tiny-llama, tiny-llama-tied, tiny-gpt2 and tiny-moe: loss and every
//           gradient within 1e-4 relative L2 in f32 (bf16: 2e-2), five training steps' losses (the
//           first run kernel by kernel, the rest replaying its CUDA graph), and a GPU run repeated
//           bit for bit (no atomics: a resumed run replays exactly).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "loom/backend/backend.h"
#include "loom/kernels/cpu/attention.h"
#include "loom/kernels/cpu/gemm.h"
#include "loom/kernels/cpu/kernels.h"
#include "loom/kernels/cuda/kernels.h"
#include "loom/runtime/executor.h"
#include "loom/train/params.h"
#include "loom/train/step.h"
#include "op_cases.h"

namespace loom {
namespace {

using runtime::Buffer;
using runtime::Device;

Device& gpu() { return backend::open(runtime::DeviceKind::cuda); }
kernels::cuda::Stream no_stream() { return nullptr; }  // the legacy default stream

double rel_l2(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

std::vector<float> as_f32(const void* p, const ir::TensorType& t) {
  const size_t n = size_t(numel(t.shape));
  std::vector<float> out(n);
  if (t.dtype == DType::f32)
    std::memcpy(out.data(), p, n * 4);
  else if (t.dtype == DType::bf16)
    for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(static_cast<const bf16*>(p)[i]);
  else
    for (size_t i = 0; i < n; ++i) out[i] = float(static_cast<const int32_t*>(p)[i]);
  return out;
}

// ---- every op harness graph on both devices ----

class GpuOps : public ::testing::TestWithParam<OpCase> {};

TEST_P(GpuOps, EqualsCpu) {
  const OpCase& c = GetParam();
  Harness h = build_harness(c);
  const ir::Graph& g = h.g;
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::map<int, std::vector<char>> host;
  bool has_bf16 = false;
  for (const ir::Value& v : g.values()) {
    has_bf16 = has_bf16 || v.type.dtype == DType::bf16;
    if (v.kind == ir::ValueKind::node) continue;
    const size_t n = size_t(numel(v.type.shape));
    std::vector<char>& d = host[v.id];
    d.resize(n * dtype_size(v.type.dtype));
    for (size_t i = 0; i < n; ++i) {
      if (v.type.dtype == DType::i32) {
        std::uniform_int_distribution<int32_t> u(0, std::max(c.id_range, 1) - 1);
        reinterpret_cast<int32_t*>(d.data())[i] = u(rng);
      } else if (v.type.dtype == DType::bf16) {
        reinterpret_cast<bf16*>(d.data())[i] = f32_to_bf16(nd(rng));
      } else {
        reinterpret_cast<float*>(d.data())[i] = nd(rng);
      }
    }
  }
  runtime::Executor cpu(g);
  for (auto& [id, d] : host) cpu.bind(id, d.data());
  cpu.run();

  Device& dev = gpu();
  runtime::Executor cuda(g, dev);
  std::vector<Buffer> bufs;
  for (auto& [id, d] : host) {
    bufs.emplace_back(dev, int64_t(d.size()));
    dev.upload(bufs.back().data(), d.data(), int64_t(d.size()));
    cuda.bind(id, bufs.back().data());
  }
  cuda.run();
  const double tol = has_bf16 ? 1e-2 : 1e-5;
  for (int o : g.outputs()) {
    const ir::Value& v = g.value(o);
    std::vector<char> down(size_t(runtime::value_bytes(v)));
    dev.download(down.data(), cuda.data(o), int64_t(down.size()));
    const std::vector<float> a = as_f32(down.data(), v.type), b = as_f32(cpu.data(o), v.type);
    EXPECT_LE(rel_l2(a.data(), b.data(), a.size()), tol) << c.name << ": %" << v.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, GpuOps, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// ---- kernels on odd and large shapes ----

// Random f32 values on the host and their copy on the GPU.
struct Tensor {
  std::vector<float> h;
  Buffer d;
  Tensor(size_t n, uint32_t seed, float lo = -1, float hi = 1) : h(n), d(gpu(), int64_t(n) * 4) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    for (float& x : h) x = u(rng);
    gpu().upload(d.data(), h.data(), int64_t(n) * 4);
  }
  float* p() { return static_cast<float*>(d.data()); }
  std::vector<float> down() const {
    std::vector<float> o(h.size());
    gpu().download(o.data(), d.data(), int64_t(o.size()) * 4);
    return o;
  }
};
// bf16 copies of a Tensor's values
struct Bf16 {
  std::vector<bf16> h;
  Buffer d;
  explicit Bf16(const std::vector<float>& x) : h(x.size()), d(gpu(), int64_t(x.size()) * 2) {
    for (size_t i = 0; i < x.size(); ++i) h[i] = f32_to_bf16(x[i]);
    gpu().upload(d.data(), h.data(), int64_t(h.size()) * 2);
  }
  bf16* p() { return static_cast<bf16*>(d.data()); }
  std::vector<float> down() const {
    std::vector<bf16> o(h.size());
    gpu().download(o.data(), d.data(), int64_t(o.size()) * 2);
    std::vector<float> f(o.size());
    for (size_t i = 0; i < o.size(); ++i) f[i] = bf16_to_f32(o[i]);
    return f;
  }
};
std::vector<float> widen(const std::vector<bf16>& x) {
  std::vector<float> f(x.size());
  for (size_t i = 0; i < x.size(); ++i) f[i] = bf16_to_f32(x[i]);
  return f;
}

#define EXPECT_CLOSE(gpu_vals, cpu_vals, tol)                                               \
  do {                                                                                      \
    const auto& ga_ = (gpu_vals);                                                           \
    const auto& cb_ = (cpu_vals);                                                           \
    ASSERT_EQ(ga_.size(), cb_.size());                                                      \
    EXPECT_LE(rel_l2(ga_.data(), cb_.data(), ga_.size()), (tol)) << #gpu_vals << " vs CPU"; \
  } while (0)

TEST(GpuKernels, GemmOddAndLarge) {
  struct S {
    int64_t batch, M, N, K;
    bool ta, tb, acc;
  };
  for (const S s :
       {S{1, 1023, 517, 769, false, false, false}, S{3, 65, 129, 33, true, false, false},
        S{1, 2048, 2048, 2048, false, true, false}, S{2, 17, 31, 1000, true, true, true},
        S{1, 4096, 50257, 64, false, true, false}}) {
    SCOPED_TRACE(fmt::format("batch {} M {} N {} K {} ta {} tb {} acc {}", s.batch, s.M, s.N, s.K,
                             s.ta, s.tb, s.acc));
    for (DType dt : {DType::f32, DType::bf16}) {
      Tensor a(size_t(s.batch * s.M * s.K), 1), b(size_t(s.batch * s.K * s.N), 2),
          c(size_t(s.batch * s.M * s.N), 3);
      kernels::cpu::GemmDesc cd{s.batch, s.M, s.N, s.K, s.ta, s.tb, dt, DType::f32, s.acc};
      kernels::cuda::GemmDesc gd{s.batch, s.M, s.N, s.K, s.ta, s.tb, dt, DType::f32, s.acc};
      std::vector<float> want = c.h;
      Bf16 ab(a.h), bb(b.h);
      const bool f32 = dt == DType::f32;
      kernels::cpu::gemm(cd, f32 ? (const void*)a.h.data() : ab.h.data(),
                         f32 ? (const void*)b.h.data() : bb.h.data(), want.data());
      // cuBLASLt and the tiled kernel: the same bf16 inputs, f32 accumulation and output
      for (auto* run : {&kernels::cuda::gemm, &kernels::cuda::gemm_tiled}) {
        SCOPED_TRACE(run == &kernels::cuda::gemm ? "cuBLASLt" : "tiled");
        gpu().upload(c.p(), c.h.data(), int64_t(c.h.size()) * 4);
        (*run)(gd, f32 ? (const void*)a.p() : ab.p(), f32 ? (const void*)b.p() : bb.p(), c.p(),
               no_stream());
        EXPECT_CLOSE(c.down(), want, 1e-5);
      }
    }
  }
}

// f32 runs the row kernels; bf16 each of cuDNN's SDPA (head sizes up to 128 in steps of 8), the
// tensor-core (flash) kernels (HS 32, 64, 128; the row kernels for 48) and the row kernels: T not a
// multiple of the 64-row tiles, grouped and plain heads, every head size.
struct AttnCase {
  int64_t B, T, NH, NKV, HS;
};
class GpuAttention : public ::testing::TestWithParam<AttnCase> {};
INSTANTIATE_TEST_SUITE_P(Shapes, GpuAttention,
                         ::testing::Values(AttnCase{2, 333, 8, 2, 64}, AttnCase{1, 200, 4, 4, 128},
                                           AttnCase{3, 77, 6, 3, 32}, AttnCase{1, 64, 2, 1, 64},
                                           AttnCase{1, 1030, 4, 1, 64}, AttnCase{2, 50, 2, 2, 48}));

TEST_P(GpuAttention, EqualsCpu) {
  const auto [B, T, NH, NKV, HS] = GetParam();
  const float sc = 1.0f / std::sqrt(float(HS));
  const size_t nq = size_t(B * T * NH * HS), nk = size_t(B * T * NKV * HS), nl = size_t(B * NH * T);
  Tensor q(nq, 4), k(nk, 5), v(nk, 6), o(nq, 7), lse(nl, 8), dout(nq, 9), dq(nq, 10), dk(nk, 11),
      dv(nk, 12);
  std::vector<float> o_c(nq), lse_c(nl), dq_c(nq), dk_c(nk), dv_c(nk);
  kernels::cpu::attention_fwd<float>(q.h.data(), k.h.data(), v.h.data(), o_c.data(), lse_c.data(),
                                     B, T, NH, NKV, HS, sc);
  kernels::cuda::attention_fwd<float>(q.p(), k.p(), v.p(), o.p(), lse.p(), B, T, NH, NKV, HS, sc,
                                      no_stream());
  EXPECT_CLOSE(o.down(), o_c, 1e-5);
  EXPECT_CLOSE(lse.down(), lse_c, 1e-5);
  gpu().upload(o.p(), o_c.data(), int64_t(nq) * 4);  // the backward reads the same o and lse
  gpu().upload(lse.p(), lse_c.data(), int64_t(nl) * 4);
  kernels::cpu::attention_bwd<float>(dout.h.data(), q.h.data(), k.h.data(), v.h.data(), o_c.data(),
                                     lse_c.data(), dq_c.data(), dk_c.data(), dv_c.data(), B, T, NH,
                                     NKV, HS, sc);
  kernels::cuda::attention_bwd<float>(dout.p(), q.p(), k.p(), v.p(), o.p(), lse.p(), dq.p(), dk.p(),
                                      dv.p(), B, T, NH, NKV, HS, sc, no_stream());
  EXPECT_CLOSE(dq.down(), dq_c, 1e-5);
  EXPECT_CLOSE(dk.down(), dk_c, 1e-5);
  EXPECT_CLOSE(dv.down(), dv_c, 1e-5);
  // bf16: the same inputs rounded; outputs within bf16's rounding, on each of the three kernels
  // (kernels.h's attention_kernels: cuDNN insists on cuDNN, a failure if it does not open)
  Bf16 qb(q.h), kb(k.h), vb(v.h), ob(o_c), db(dout.h), dqb(dq_c), dkb(dk_c), dvb(dv_c);
  std::vector<bf16> ob_c(nq), dqb_c(nq), dkb_c(nk), dvb_c(nk);
  std::vector<float> lse_b(nl);
  kernels::cpu::attention_fwd<bf16>(qb.h.data(), kb.h.data(), vb.h.data(), ob_c.data(),
                                    lse_b.data(), B, T, NH, NKV, HS, sc);
  kernels::cpu::attention_bwd<bf16>(db.h.data(), qb.h.data(), kb.h.data(), vb.h.data(), ob_c.data(),
                                    lse_b.data(), dqb_c.data(), dkb_c.data(), dvb_c.data(), B, T,
                                    NH, NKV, HS, sc);
  using kernels::cuda::AttentionKernels;
  for (const auto& [kind, name] :
       {std::pair{AttentionKernels::cudnn, "cudnn"}, std::pair{AttentionKernels::flash, "flash"},
        std::pair{AttentionKernels::row, "row"}}) {
    SCOPED_TRACE(name);
    kernels::cuda::set_attention_kernels(kind);
    kernels::cuda::attention_fwd<bf16>(qb.p(), kb.p(), vb.p(), ob.p(), lse.p(), B, T, NH, NKV, HS,
                                       sc, no_stream());
    EXPECT_CLOSE(ob.down(), widen(ob_c), 1e-2);
    EXPECT_CLOSE(lse.down(), lse_b, 2e-3);  // the fused kernels sum bf16-rounded probabilities
    gpu().upload(ob.p(), ob_c.data(), int64_t(nq) * 2);  // the backward reads the CPU's o and lse
    gpu().upload(lse.p(), lse_b.data(), int64_t(nl) * 4);
    kernels::cuda::attention_bwd<bf16>(db.p(), qb.p(), kb.p(), vb.p(), ob.p(), lse.p(), dqb.p(),
                                       dkb.p(), dvb.p(), B, T, NH, NKV, HS, sc, no_stream());
    EXPECT_CLOSE(dqb.down(), widen(dqb_c), 1e-2);
    EXPECT_CLOSE(dkb.down(), widen(dkb_c), 1e-2);
    EXPECT_CLOSE(dvb.down(), widen(dvb_c), 1e-2);
  }
  kernels::cuda::set_attention_kernels(AttentionKernels::automatic);
}

// add and the casts move 4 elements per access when aligned: bit-equal to the CPU on sizes with a
// tail and on pointers one element off (the one-by-one kernels)
TEST(GpuKernels, ElementwiseWideAndTail) {
  for (const int64_t n : {int64_t(0), int64_t(3), int64_t(1001), int64_t(4098)}) {
    for (const int64_t off : {int64_t(0), int64_t(1)}) {
      SCOPED_TRACE(fmt::format("n {} offset {}", n, off));
      Tensor a(size_t(n + 1), 60, -1e3f, 1e3f), b(size_t(n + 1), 61), y(size_t(n + 1), 62);
      std::vector<float> want(size_t(n + 1));
      kernels::cpu::add(a.h.data() + off, b.h.data() + off, want.data(), n);
      kernels::cuda::add(a.p() + off, b.p() + off, y.p() + off, n, no_stream());
      const std::vector<float> got = y.down();
      EXPECT_EQ(0, std::memcmp(got.data() + off, want.data(), size_t(n) * 4)) << "add";
      Bf16 yb(std::vector<float>(size_t(n + 1)));
      std::vector<bf16> wb(size_t(n + 1));
      kernels::cpu::cast_f32_bf16(a.h.data() + off, wb.data(), n);
      kernels::cuda::cast_f32_bf16(a.p() + off, yb.p() + off, n, no_stream());
      std::vector<bf16> gb(size_t(n + 1));
      gpu().download(gb.data(), yb.p(), int64_t(n + 1) * 2);
      EXPECT_EQ(0, std::memcmp(gb.data() + off, wb.data(), size_t(n) * 2)) << "cast to bf16";
      kernels::cpu::cast_bf16_f32(wb.data(), want.data(), n);
      kernels::cuda::cast_bf16_f32(yb.p() + off, y.p() + off, n, no_stream());
      const std::vector<float> back = y.down();
      EXPECT_EQ(0, std::memcmp(back.data() + off, want.data(), size_t(n) * 4)) << "cast to f32";
    }
  }
}

// add_bias, broadcast_rows, GELU and SwiGLU move 4 elements per access when aligned (add_bias:
// rows of C % 4 == 0): equal to the CPU on rows and sizes with a tail and on pointers one element
// off (the one-by-one kernels)
TEST(GpuKernels, PointwiseWideAndTail) {
  auto from = [](const std::vector<float>& v, int64_t off, int64_t n) {
    return std::vector<float>(v.begin() + off, v.begin() + off + n);
  };
  for (const auto& [N, C] : {std::pair<int64_t, int64_t>{1001, 768}, {37, 771}, {5, 4}, {3, 2}}) {
    for (const int64_t off : {int64_t(0), int64_t(1)}) {
      SCOPED_TRACE(fmt::format("N {} C {} offset {}", N, C, off));
      const int64_t n = N * C;
      Tensor a(size_t(n + 1), 70, -4, 4), b(size_t(C + 1), 71), y(size_t(n + 1), 72),
          dy(size_t(n + 1), 73), z(size_t(n + 1), 74);
      std::vector<float> want(static_cast<size_t>(n)), want2(static_cast<size_t>(n));
      kernels::cpu::add_bias(a.h.data() + off, b.h.data() + off, want.data(), N, C);
      kernels::cuda::add_bias(a.p() + off, b.p() + off, y.p() + off, N, C, no_stream());
      EXPECT_EQ(from(y.down(), off, n), want) << "add_bias";
      kernels::cuda::broadcast_rows(b.p() + off, y.p() + off, N, C, no_stream());
      for (int64_t i = 0; i < n; ++i) want[size_t(i)] = b.h[size_t(off + i % C)];
      EXPECT_EQ(from(y.down(), off, n), want) << "broadcast_rows";
      kernels::cpu::gelu_fwd(a.h.data() + off, want.data(), n);
      kernels::cuda::gelu_fwd(a.p() + off, y.p() + off, n, no_stream());
      EXPECT_CLOSE(from(y.down(), off, n), want, 1e-5);
      kernels::cpu::gelu_bwd(dy.h.data() + off, a.h.data() + off, want.data(), n);
      kernels::cuda::gelu_bwd(dy.p() + off, a.p() + off, y.p() + off, n, no_stream());
      EXPECT_CLOSE(from(y.down(), off, n), want, 1e-5);
      kernels::cpu::swiglu_fwd(a.h.data() + off, dy.h.data() + off, want.data(), n);
      kernels::cuda::swiglu_fwd(a.p() + off, dy.p() + off, y.p() + off, n, no_stream());
      EXPECT_CLOSE(from(y.down(), off, n), want, 1e-5);
      kernels::cpu::swiglu_bwd(z.h.data() + off, a.h.data() + off, dy.h.data() + off, want.data(),
                               want2.data(), n);
      Tensor du(size_t(n + 1), 77);
      kernels::cuda::swiglu_bwd(z.p() + off, a.p() + off, dy.p() + off, y.p() + off, du.p() + off,
                                n, no_stream());
      EXPECT_CLOSE(from(y.down(), off, n), want, 1e-5);
      EXPECT_CLOSE(from(du.down(), off, n), want2, 1e-5);
      Bf16 gb(a.h), ub(dy.h), yb(std::vector<float>(size_t(n + 1)));
      std::vector<bf16> wb(static_cast<size_t>(n));
      kernels::cpu::swiglu_fwd_bf16(gb.h.data() + off, ub.h.data() + off, wb.data(), n);
      kernels::cuda::swiglu_fwd_bf16(gb.p() + off, ub.p() + off, yb.p() + off, n, no_stream());
      EXPECT_CLOSE(from(yb.down(), off, n), widen(wb), 1e-2);
    }
  }
}

// cross-entropy's rows 4 wide (V % 4 == 0), dlogits written over the logits
TEST(GpuKernels, CrossEntropyWideRowsInPlace) {
  const int64_t N = 67, V = 50304;
  Tensor logits(size_t(N * V), 75, -4, 4), loss(1, 76);
  std::vector<int32_t> t(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) t[size_t(i)] = int32_t((i * 7919 + 3) % V);
  t[0] = 0;
  t[1] = int32_t(V - 1);
  Buffer td(gpu(), N * 4);
  gpu().upload(td.data(), t.data(), N * 4);
  std::vector<float> loss_c(1), dl_c(static_cast<size_t>(N * V));
  kernels::cpu::cross_entropy(logits.h.data(), t.data(), loss_c.data(), dl_c.data(), N, V, N);
  kernels::cuda::cross_entropy(logits.p(), static_cast<int32_t*>(td.data()), loss.p(), logits.p(),
                               N, V, N, no_stream());
  EXPECT_CLOSE(loss.down(), loss_c, 1e-5);
  EXPECT_CLOSE(logits.down(), dl_c, 1e-5);
}

TEST(GpuKernels, CrossEntropyGpt2Vocab) {
  const int64_t N = 131, V = 50257;
  Tensor logits(size_t(N * V), 13, -4, 4), dl(size_t(N * V), 14), loss(1, 15);
  std::vector<int32_t> t(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) t[size_t(i)] = int32_t((i * 7919) % V);
  Buffer td(gpu(), N * 4);
  gpu().upload(td.data(), t.data(), N * 4);
  std::vector<float> loss_c(1), dl_c(static_cast<size_t>(N * V));
  kernels::cpu::cross_entropy(logits.h.data(), t.data(), loss_c.data(), dl_c.data(), N, V, 2 * N);
  kernels::cuda::cross_entropy(logits.p(), static_cast<int32_t*>(td.data()), loss.p(), dl.p(), N, V,
                               2 * N, no_stream());
  EXPECT_CLOSE(loss.down(), loss_c, 1e-5);
  EXPECT_CLOSE(dl.down(), dl_c, 1e-5);
}

TEST(GpuKernels, NormsWideRows) {
  const int64_t N = 1001, C = 2049;
  Tensor x(size_t(N * C), 16), w(size_t(C), 17), b(size_t(C), 18), dy(size_t(N * C), 19),
      y(size_t(N * C), 20), mean(size_t(N), 21), rstd(size_t(N), 22), dx(size_t(N * C), 23),
      dw(size_t(C), 24), db(size_t(C), 25);
  std::vector<float> y_c(static_cast<size_t>(N * C)), mean_c(static_cast<size_t>(N)),
      rstd_c(static_cast<size_t>(N)), dx_c(static_cast<size_t>(N * C)),
      dw_c(static_cast<size_t>(C)), db_c(static_cast<size_t>(C));
  kernels::cpu::rmsnorm_fwd(x.h.data(), w.h.data(), y_c.data(), rstd_c.data(), N, C, 1e-5f);
  kernels::cuda::rmsnorm_fwd(x.p(), w.p(), y.p(), rstd.p(), N, C, 1e-5f, no_stream());
  EXPECT_CLOSE(y.down(), y_c, 1e-5);
  EXPECT_CLOSE(rstd.down(), rstd_c, 1e-5);
  kernels::cpu::rmsnorm_bwd(dy.h.data(), x.h.data(), w.h.data(), rstd_c.data(), dx_c.data(),
                            dw_c.data(), N, C);
  kernels::cuda::rmsnorm_bwd(dy.p(), x.p(), w.p(), rstd.p(), dx.p(), dw.p(), N, C, no_stream());
  EXPECT_CLOSE(dx.down(), dx_c, 1e-5);
  EXPECT_CLOSE(dw.down(), dw_c, 1e-5);
  kernels::cpu::layernorm_fwd(x.h.data(), w.h.data(), b.h.data(), y_c.data(), mean_c.data(),
                              rstd_c.data(), N, C, 1e-5f);
  kernels::cuda::layernorm_fwd(x.p(), w.p(), b.p(), y.p(), mean.p(), rstd.p(), N, C, 1e-5f,
                               no_stream());
  EXPECT_CLOSE(y.down(), y_c, 1e-5);
  kernels::cpu::layernorm_bwd(dy.h.data(), x.h.data(), w.h.data(), mean_c.data(), rstd_c.data(),
                              dx_c.data(), dw_c.data(), db_c.data(), N, C);
  kernels::cuda::layernorm_bwd(dy.p(), x.p(), w.p(), mean.p(), rstd.p(), dx.p(), dw.p(), db.p(), N,
                               C, no_stream());
  EXPECT_CLOSE(dx.down(), dx_c, 1e-5);
  EXPECT_CLOSE(dw.down(), dw_c, 1e-5);
  EXPECT_CLOSE(db.down(), db_c, 1e-5);
}

TEST(GpuKernels, EmbeddingGradRepeatedIds) {
  const int64_t N = 4099, V = 1000, C = 771;
  Tensor table(size_t(V * C), 26), out(size_t(N * C), 27), dout(size_t(N * C), 28),
      dtable(size_t(V * C), 29);
  std::vector<int32_t> ids(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) ids[size_t(i)] = int32_t((i * i + 3) % 97);  // many repeats
  Buffer idd(gpu(), N * 4);
  gpu().upload(idd.data(), ids.data(), N * 4);
  const auto* id = static_cast<const int32_t*>(idd.data());
  std::vector<float> out_c(static_cast<size_t>(N * C)), dt_c(static_cast<size_t>(V * C));
  kernels::cpu::embedding_fwd(ids.data(), table.h.data(), out_c.data(), N, C);
  kernels::cuda::embedding_fwd(id, table.p(), out.p(), N, C, no_stream());
  EXPECT_CLOSE(out.down(), out_c, 0.0);
  kernels::cpu::embedding_bwd(ids.data(), dout.h.data(), dt_c.data(), N, V, C);
  kernels::cuda::embedding_bwd(id, dout.p(), dtable.p(), N, V, C, no_stream());
  EXPECT_CLOSE(dtable.down(), dt_c, 1e-5);
}

// sum and sumsq of one element block (one kernel) and of two (partials, then their sum)
TEST(GpuKernels, ShortReductions) {
  for (const int64_t n : {int64_t(0), int64_t(1), int64_t(768), int64_t(16384), int64_t(16385)}) {
    SCOPED_TRACE(n);
    Tensor x(size_t(n + 1), 78), y(1, 79);
    std::vector<float> y_c(1);
    kernels::cpu::sum(x.h.data(), y_c.data(), n);
    kernels::cuda::sum(x.p(), y.p(), n, no_stream());
    EXPECT_NEAR(y.down()[0], y_c[0], 1e-5 * std::sqrt(double(n) + 1));
    kernels::cpu::sumsq(x.h.data(), y_c.data(), n);
    kernels::cuda::sumsq(x.p(), y.p(), n, no_stream());
    EXPECT_NEAR(y.down()[0], y_c[0], 1e-6 * (y_c[0] + 1));
  }
}

TEST(GpuKernels, LongReductionsAndAdamW) {
  const int64_t n = 10'000'003;
  Tensor x(size_t(n), 30), y(1, 31), p(size_t(n), 32), g(size_t(n), 33), m(size_t(n), 34, 0, 0.1f),
      v(size_t(n), 35, 0, 0.01f), hyper(3, 36), gs(1, 37), rows(size_t(n / 7 + 1), 38);
  std::vector<float> y_c(1);
  kernels::cpu::sum(x.h.data(), y_c.data(), n);
  kernels::cuda::sum(x.p(), y.p(), n, no_stream());
  EXPECT_NEAR(y.down()[0], y_c[0], 1e-3 * std::sqrt(double(n)) * 1e-3 + 1e-2);
  kernels::cpu::sumsq(x.h.data(), y_c.data(), n);
  kernels::cuda::sumsq(x.p(), y.p(), n, no_stream());
  EXPECT_CLOSE(y.down(), y_c, 1e-5);
  const int64_t C = 7, N = n / C;
  std::vector<float> r_c(static_cast<size_t>(C));
  Tensor r(size_t(C), 39);
  kernels::cpu::sum_rows(x.h.data(), r_c.data(), N, C);
  kernels::cuda::sum_rows(x.p(), r.p(), N, C, no_stream());
  EXPECT_CLOSE(r.down(), r_c, 1e-4);
  const std::vector<float> hy = {1e-3f, 0.1f, 0.001f}, gsc = {0.5f};
  gpu().upload(hyper.p(), hy.data(), 12);
  gpu().upload(gs.p(), gsc.data(), 4);
  std::vector<float> pc = p.h, mc = m.h, vc = v.h;
  kernels::cpu::adamw(pc.data(), g.h.data(), mc.data(), vc.data(), hy.data(), gsc.data(), n, 0.9f,
                      0.95f, 1e-8f, 0.1f);
  kernels::cuda::adamw(p.p(), g.p(), m.p(), v.p(), hyper.p(), gs.p(), n, 0.9f, 0.95f, 1e-8f, 0.1f,
                       no_stream());
  EXPECT_CLOSE(p.down(), pc, 1e-6);
  EXPECT_CLOSE(m.down(), mc, 1e-6);
  EXPECT_CLOSE(v.down(), vc, 1e-6);
}

// ---- whole steps ----

struct StepCase {
  std::string config, dtype;
};
void PrintTo(const StepCase& c, std::ostream* os) { *os << c.config << "-" << c.dtype; }

train::Config step_config(const StepCase& c, const std::string& device) {
  return train::load_config(std::string(LOOM_SOURCE_DIR) + "/configs/" + c.config + ".toml",
                            {"train.batch_size=4", "train.seq_len=32", "model.dtype=" + c.dtype,
                             "train.device=" + device});
}
std::vector<int32_t> tokens(const train::Config& c, int64_t step) {
  std::mt19937 rng(uint32_t(31 * step + 1));
  std::uniform_int_distribution<int32_t> u(0, int32_t(c.model.vocab_size - 1));
  std::vector<int32_t> t(size_t(c.train.batch_size * (c.train.seq_len + 1)));
  for (auto& x : t) x = u(rng);
  return t;
}

class GpuSteps : public ::testing::TestWithParam<StepCase> {};

TEST_P(GpuSteps, GradientsEqualCpu) {
  const StepCase& c = GetParam();
  const double tol = c.dtype == "f32" ? 1e-4 : 2e-2;
  train::Config cc = step_config(c, "cpu"), gc = step_config(c, "cuda");
  train::ParamStore pc(cc.model), pg(gc.model);
  pc.init_random(5);
  pg.init_random(5);
  train::StepRunner rc(cc, pc, train::StepRunner::Mode::grads),
      rg(gc, pg, train::StepRunner::Mode::grads);
  const std::vector<int32_t> t = tokens(cc, 1);
  const float lc = rc.step(t.data()), lg = rg.step(t.data());
  EXPECT_NEAR(lg, lc, tol * std::abs(lc)) << "loss";
  for (const auto& p : pc.infos()) {
    const size_t n = size_t(numel(p.shape));
    EXPECT_LE(rel_l2(rg.grad(p.name), rc.grad(p.name), n), tol) << "d loss / d " << p.name;
  }
}

TEST_P(GpuSteps, TrainingEqualsCpuAndRepeatsBitForBit) {
  const StepCase& c = GetParam();
  const double tol = c.dtype == "f32" ? 1e-4 : 2e-2;
  auto run = [&](const std::string& device) {
    train::Config cfg = step_config(c, device);
    train::ParamStore p(cfg.model);
    p.init_random(6);
    train::StepRunner r(cfg, p, train::StepRunner::Mode::train);
    std::vector<float> losses;
    for (int64_t s = 1; s <= 5; ++s) losses.push_back(r.step(tokens(cfg, s).data(), 1e-3));
    losses.push_back(r.grad_norm());
    const char* graphs = std::getenv("LOOM_CUDA_GRAPHS");
    if (device == "cuda" && !(graphs && std::string(graphs) == "0")) {
      EXPECT_TRUE(r.executor().replayed()) << "steps 2.. should replay the step's CUDA graph";
    }
    r.push_params();
    for (const auto& info : p.infos()) losses.push_back(p.data(info.name)[0]);
    return losses;
  };
  const std::vector<float> cpu = run("cpu"), a = run("cuda"), b = run("cuda");
  for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(a[i], cpu[i], tol * std::abs(cpu[i])) << "step " << i;
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "two GPU runs differ";
}

INSTANTIATE_TEST_SUITE_P(
    Models, GpuSteps,
    ::testing::Values(StepCase{"tiny-llama", "f32"}, StepCase{"tiny-llama", "bf16"},
                      StepCase{"tiny-llama-tied", "f32"}, StepCase{"tiny-gpt2", "f32"},
                      StepCase{"tiny-gpt2", "bf16"}, StepCase{"tiny-moe", "f32"},
                      StepCase{"tiny-moe", "bf16"},
                      // head size 64: bf16 attention on cuDNN (flash_attention.cu without it)
                      StepCase{"bench-llama", "bf16"}, StepCase{"bench-gpt2", "bf16"}),
    [](const auto& info) {
      std::string s = info.param.config + "_" + info.param.dtype;
      for (char& ch : s)
        if (ch == '-') ch = '_';
      return s;
    });

}  // namespace
}  // namespace loom
