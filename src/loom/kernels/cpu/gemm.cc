// GEMM through the oneDNN matmul primitive, and the plain reference loop it is tested against.
//
// Layouts never get copied here: a transposed operand is described to oneDNN by its strides, e.g. A
// stored (K,M) for ta is the logical (M,K) matrix with strides {1,M} (format "ba"; with a batch,
// the logical (batch,M,K) with strides {M*K,1,M}, format "acb"). `accumulate` is a sum post-op
// (beta = 1), so C += A·B costs no extra pass over C.
//
// What this file does not do: pack weights into oneDNN's blocked layouts, nor copy a transposed A
// into row-major order: at the transformer training shapes (bench/gemm_bench.cc) either one, its
// reorder included, is within a few percent of the plain-layout GEMM. Nor does it choose the thread
// count (oneDNN uses OpenMP's).
//
// One row times a weight (M = 1, a decode step's matmuls) goes to gemv (gemv.h), which streams the
// weight at the machine's bandwidth where oneDNN 2.6's matmul does not.
//
// Invariant: one primitive per (GemmDesc, OpenMP thread count) per calling thread, created on first
// use and reused; a call only swaps the data pointers of the cached memory objects and executes.
#include "loom/kernels/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <ostream>
#include <type_traits>
#include <unordered_map>

#include "dnnl.hpp"
#include "loom/core/error.h"
#include "loom/kernels/cpu/gemv.h"

namespace loom::kernels {

std::ostream& operator<<(std::ostream& os, const GemmDesc& d) {
  return os << "gemm{batch=" << d.batch << " M=" << d.M << " N=" << d.N << " K=" << d.K
            << " ta=" << d.ta << " tb=" << d.tb << " ab=" << dtype_name(d.ab_dtype)
            << " c=" << dtype_name(d.c_dtype) << " accumulate=" << d.accumulate << "}";
}

}  // namespace loom::kernels

namespace loom::kernels::cpu {

namespace {

using dnnl::memory;

// The one place oneDNN errors are caught: a failure here is an internal error (the executor only
// builds valid descs), so it aborts with the desc and oneDNN's status.
template <class F>
auto dnnl_checked(const GemmDesc& d, const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    LOOM_CHECK(false) << "oneDNN " << what << " failed for " << d << ": " << e.what()
                      << " (dnnl_status_t " << int(e.status) << ")";
    std::abort();  // not reached: a failed LOOM_CHECK aborts
  }
}

void check_desc(const GemmDesc& d) {
  LOOM_CHECK(d.batch >= 0 && d.M >= 0 && d.N >= 0 && d.K >= 0) << d;
  LOOM_CHECK(d.ab_dtype == DType::f32 || d.ab_dtype == DType::bf16) << d;
  LOOM_CHECK(d.c_dtype == DType::f32 || d.c_dtype == DType::bf16) << d;
  LOOM_CHECK(d.c_dtype == DType::f32 || d.ab_dtype == DType::bf16)
      << "a bf16 C needs bf16 inputs (oneDNN 2.6 has no f32 x f32 -> bf16 matmul): " << d;
}

memory::data_type to_dnnl(DType t) {
  return t == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32;
}

// Logical (rows, cols) matrix, stored row-major, or column-major when `transposed` (i.e. the stored
// matrix is (cols, rows)). With batch > 1 a leading batch dim of stride rows*cols is added.
memory::desc matrix_desc(int64_t batch, int64_t rows, int64_t cols, bool transposed, DType t) {
  const memory::dim rs = transposed ? 1 : cols, cs = transposed ? rows : 1;
  if (batch == 1) return memory::desc({rows, cols}, to_dnnl(t), {rs, cs});
  return memory::desc({batch, rows, cols}, to_dnnl(t), {rows * cols, rs, cs});
}

struct CacheKey {
  GemmDesc desc;
  int threads;  // brgemm kernels fix their thread partition when the primitive is created
  bool operator==(const CacheKey&) const = default;
};

struct CacheKeyHash {
  size_t operator()(const CacheKey& k) const {
    const GemmDesc& d = k.desc;
    size_t h = 0;
    auto mix = [&h](uint64_t v) {
      h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    };
    mix(uint64_t(d.batch));
    mix(uint64_t(d.M));
    mix(uint64_t(d.N));
    mix(uint64_t(d.K));
    mix(uint64_t(d.ta) | uint64_t(d.tb) << 1 | uint64_t(d.accumulate) << 2 |
        uint64_t(d.ab_dtype) << 8 | uint64_t(d.c_dtype) << 16 | uint64_t(k.threads) << 24);
    return h;
  }
};

// A primitive with its memory objects; execution rebinds their data handles (cheap on CPU).
struct CachedGemm {
  dnnl::matmul prim;
  memory a, b, c;
};

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

CachedGemm make_gemm(const GemmDesc& d) {
  return dnnl_checked(d, "matmul creation", [&] {
    const memory::desc a_md = matrix_desc(d.batch, d.M, d.K, d.ta, d.ab_dtype);
    const memory::desc b_md = matrix_desc(d.batch, d.K, d.N, d.tb, d.ab_dtype);
    const memory::desc c_md = matrix_desc(d.batch, d.M, d.N, false, d.c_dtype);
    dnnl::primitive_attr attr;
    if (d.accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.f);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, cpu_engine());
    const dnnl::engine& e = cpu_engine();
    return CachedGemm{dnnl::matmul(pd), memory(a_md, e, nullptr), memory(b_md, e, nullptr),
                      memory(c_md, e, nullptr)};
  });
}

CachedGemm& cached_gemm(const GemmDesc& d) {
  thread_local std::unordered_map<CacheKey, CachedGemm, CacheKeyHash> cache;
  const CacheKey key{d, omp_get_max_threads()};
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_gemm(d)).first;
  return it->second;
}

// C (batch,M,N) = 0 for the degenerate K = 0 product (or left as is when accumulating).
void zero_c(const GemmDesc& d, void* c) {
  if (d.accumulate) return;
  const int64_t n = d.batch * d.M * d.N;
  if (d.c_dtype == DType::f32) {
    std::fill_n(static_cast<float*>(c), n, 0.f);
  } else {
    std::fill_n(static_cast<bf16*>(c), n, bf16{0});
  }
}

}  // namespace

void gemm(const GemmDesc& d, const void* a, const void* b, void* c) {
  check_desc(d);
  if (d.batch == 0 || d.M == 0 || d.N == 0) return;
  if (d.K == 0) return zero_c(d, c);
  if (d.batch == 1 && d.M == 1 && !d.accumulate)  // one row of A is contiguous, ta or not
    return gemv(d.N, d.K, d.tb, d.ab_dtype, a, b, c, d.c_dtype);
  CachedGemm& g = cached_gemm(d);
  thread_local dnnl::stream stream =
      dnnl_checked(d, "stream creation", [] { return dnnl::stream(cpu_engine()); });
  dnnl_checked(d, "matmul execution", [&] {
    g.a.set_data_handle(const_cast<void*>(a));
    g.b.set_data_handle(const_cast<void*>(b));
    g.c.set_data_handle(c);
    g.prim.execute(stream, {{DNNL_ARG_SRC, g.a}, {DNNL_ARG_WEIGHTS, g.b}, {DNNL_ARG_DST, g.c}});
    stream.wait();
  });
}

namespace {

template <class T>
double load(const void* p, int64_t i) {
  if constexpr (std::is_same_v<T, float>) {
    return static_cast<const float*>(p)[i];
  } else {
    return bf16_to_f32(static_cast<const bf16*>(p)[i]);
  }
}

template <class TAB, class TC>
void gemm_ref_typed(const GemmDesc& d, const void* a, const void* b, void* c) {
  for (int64_t p = 0; p < d.batch; ++p) {
    const int64_t a0 = p * d.M * d.K, b0 = p * d.K * d.N, c0 = p * d.M * d.N;
    for (int64_t i = 0; i < d.M; ++i) {
      for (int64_t j = 0; j < d.N; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < d.K; ++k) {
          const int64_t ai = d.ta ? k * d.M + i : i * d.K + k;  // A (K,M) or (M,K)
          const int64_t bi = d.tb ? j * d.K + k : k * d.N + j;  // B (N,K) or (K,N)
          acc += load<TAB>(a, a0 + ai) * load<TAB>(b, b0 + bi);
        }
        const int64_t ci = c0 + i * d.N + j;
        if (d.accumulate) acc += load<TC>(c, ci);
        if constexpr (std::is_same_v<TC, float>) {
          static_cast<float*>(c)[ci] = float(acc);
        } else {
          static_cast<bf16*>(c)[ci] = f32_to_bf16(float(acc));
        }
      }
    }
  }
}

}  // namespace

void gemm_ref(const GemmDesc& d, const void* a, const void* b, void* c) {
  check_desc(d);
  const bool ab32 = d.ab_dtype == DType::f32, c32 = d.c_dtype == DType::f32;
  if (ab32 && c32) gemm_ref_typed<float, float>(d, a, b, c);
  if (ab32 && !c32) gemm_ref_typed<float, bf16>(d, a, b, c);
  if (!ab32 && c32) gemm_ref_typed<bf16, float>(d, a, b, c);
  if (!ab32 && !c32) gemm_ref_typed<bf16, bf16>(d, a, b, c);
}

}  // namespace loom::kernels::cpu
