// gemm (kernels.h) through cuBLASLt, opened with dlopen from the GPU machine's own installation:
// the build needs cuBLAS's headers only (scripts/setup_cuda.sh), CI and the CPU machines no
// library.
//
// Row-major C (M,N) = op(A) op(B) is cuBLAS's column-major C^T (N,M) = op(B)^T op(A)^T, so B is
// passed as cuBLAS's first operand and A as its second, each with the layout it is stored in.
// f32 runs in CUBLAS_COMPUTE_32F (no TF32); bf16 inputs accumulate in f32 into an f32 or bf16 C;
// `accumulate` is beta = 1. A batch is a strided batch. Each shape's descriptors and the algorithm
// cuBLASLt's heuristic picks are made once and kept; a 32 MiB workspace serves every call on the
// one stream the device queues on. For a fixed algorithm and GPU, cuBLASLt repeats bit for bit.
//
// Where the library is looked for: $LOOM_CUBLASLT (a file), else "libcublasLt.so.13" through the
// loader's search path (LD_LIBRARY_PATH: scripts/gpu_check.sh adds the directory of the GPU
// machine's Python package nvidia-cublas). LOOM_CUDA_GEMM=tiled uses gemm.cu's tiled kernel instead
// (a check of one against the other); so does an f32 x f32 -> bf16 product, which cuBLASLt does not
// offer.
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "loom/core/error.h"
#include "loom/kernels/cuda/cuda_check.h"
#include "loom/kernels/cuda/kernels.h"

namespace loom::kernels::cuda {

namespace {

constexpr size_t kWorkspace = size_t(32) << 20;

// The cuBLASLt entry points Loom calls, resolved from the library.
struct Lt {
  void* lib = nullptr;
  std::string from;
#define LOOM_LT_FN(name) decltype(&::name) name = nullptr;
  LOOM_LT_FN(cublasLtCreate)
  LOOM_LT_FN(cublasLtGetStatusString)
  LOOM_LT_FN(cublasLtMatmulDescCreate)
  LOOM_LT_FN(cublasLtMatmulDescSetAttribute)
  LOOM_LT_FN(cublasLtMatrixLayoutCreate)
  LOOM_LT_FN(cublasLtMatrixLayoutSetAttribute)
  LOOM_LT_FN(cublasLtMatmulPreferenceCreate)
  LOOM_LT_FN(cublasLtMatmulPreferenceSetAttribute)
  LOOM_LT_FN(cublasLtMatmulAlgoGetHeuristic)
  LOOM_LT_FN(cublasLtMatmul)
#undef LOOM_LT_FN
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};

void lt_check(const Lt& lt, cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  throw Error(fmt::format("cuBLASLt: {}: {} ({})", what,
                          lt.cublasLtGetStatusString ? lt.cublasLtGetStatusString(st) : "?",
                          int(st)));
}

Lt open_lt() {
  Lt lt;
  const char* env = std::getenv("LOOM_CUBLASLT");
  lt.from = env && *env ? env : "libcublasLt.so.13";
  lt.lib = dlopen(lt.from.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lt.lib)
    throw Error(fmt::format("device = \"cuda\" needs cuBLASLt: cannot open {} ({}); looked in "
                            "$LOOM_CUBLASLT, LD_LIBRARY_PATH and the loader's default paths",
                            lt.from, dlerror()),
                "put the directory of libcublasLt.so.13 (the Python package nvidia-cublas has it "
                "under nvidia/cu13/lib) on LD_LIBRARY_PATH, or set LOOM_CUBLASLT to the file");
  auto sym = [&](const char* name) {
    void* p = dlsym(lt.lib, name);
    if (!p)
      throw Error(fmt::format("cuBLASLt: {} has no symbol {} (not cuBLAS 13?)", lt.from, name));
    return p;
  };
#define LOOM_LT_SYM(name) lt.name = reinterpret_cast<decltype(lt.name)>(sym(#name));
  LOOM_LT_SYM(cublasLtCreate)
  LOOM_LT_SYM(cublasLtGetStatusString)
  LOOM_LT_SYM(cublasLtMatmulDescCreate)
  LOOM_LT_SYM(cublasLtMatmulDescSetAttribute)
  LOOM_LT_SYM(cublasLtMatrixLayoutCreate)
  LOOM_LT_SYM(cublasLtMatrixLayoutSetAttribute)
  LOOM_LT_SYM(cublasLtMatmulPreferenceCreate)
  LOOM_LT_SYM(cublasLtMatmulPreferenceSetAttribute)
  LOOM_LT_SYM(cublasLtMatmulAlgoGetHeuristic)
  LOOM_LT_SYM(cublasLtMatmul)
#undef LOOM_LT_SYM
  lt_check(lt, lt.cublasLtCreate(&lt.handle), "creating a handle");
  check(int(cudaMalloc(&lt.workspace, kWorkspace)), "allocating cuBLASLt's workspace");
  return lt;
}

Lt& lt() {
  static Lt l = open_lt();  // a throw leaves it unmade: the next call tries again
  return l;
}

// One shape's descriptors and algorithm, made once.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLAS's A (ours B), B, C
  cublasLtMatmulAlgo_t algo{};
};

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, DType, DType, bool>;

cudaDataType_t cuda_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

cublasLtMatrixLayout_t layout(Lt& l, DType t, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                              int64_t stride) {
  cublasLtMatrixLayout_t m = nullptr;
  lt_check(l, l.cublasLtMatrixLayoutCreate(&m, cuda_type(t), uint64_t(rows), uint64_t(cols), ld),
           "a matrix layout");
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    lt_check(l,
             l.cublasLtMatrixLayoutSetAttribute(m, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                sizeof count),
             "a batch count");
    lt_check(l,
             l.cublasLtMatrixLayoutSetAttribute(m, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                &stride, sizeof stride),
             "a batch stride");
  }
  return m;
}

Plan make_plan(Lt& l, const GemmDesc& d) {
  Plan p;
  lt_check(l, l.cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "a matmul desc");
  const cublasOperation_t ta = d.tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS's A is our B
  const cublasOperation_t tb = d.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  lt_check(l, l.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
           "transa");
  lt_check(l, l.cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
           "transb");
  // stored layouts, column-major: our B (K,N) row-major is (N,K) ld N; (N,K) when tb is (K,N) ld K
  p.a = d.tb ? layout(l, d.ab_dtype, d.K, d.N, d.K, d.batch, d.K * d.N)
             : layout(l, d.ab_dtype, d.N, d.K, d.N, d.batch, d.K * d.N);
  p.b = d.ta ? layout(l, d.ab_dtype, d.M, d.K, d.M, d.batch, d.M * d.K)
             : layout(l, d.ab_dtype, d.K, d.M, d.K, d.batch, d.M * d.K);
  p.c = layout(l, d.c_dtype, d.N, d.M, d.N, d.batch, d.M * d.N);
  cublasLtMatmulPreference_t pref = nullptr;
  lt_check(l, l.cublasLtMatmulPreferenceCreate(&pref), "a preference");
  const uint64_t ws = kWorkspace;
  lt_check(l,
           l.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof ws),
           "the workspace size");
  cublasLtMatmulHeuristicResult_t r{};
  int found = 0;
  lt_check(
      l, l.cublasLtMatmulAlgoGetHeuristic(l.handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &r, &found),
      "choosing an algorithm");
  if (found < 1)
    throw Error(
        fmt::format("cuBLASLt has no algorithm for batch {} M {} N {} K {} ta {} tb {} "
                    "{} x {} -> {}",
                    d.batch, d.M, d.N, d.K, d.ta, d.tb, dtype_name(d.ab_dtype),
                    dtype_name(d.ab_dtype), dtype_name(d.c_dtype)));
  p.algo = r.algo;
  return p;
}

bool tiled_forced() {
  static const bool on = [] {
    const char* v = std::getenv("LOOM_CUDA_GEMM");
    return v && std::string(v) == "tiled";
  }();
  return on;
}

}  // namespace

void gemm(const GemmDesc& d, const void* a, const void* b, void* c, Stream s) {
  if (tiled_forced() || (d.ab_dtype == DType::f32 && d.c_dtype == DType::bf16))
    return gemm_tiled(d, a, b, c, s);
  if (d.batch <= 0 || d.M <= 0 || d.N <= 0) return;
  if (d.K <= 0) return gemm_tiled(d, a, b, c, s);  // zeros (or C as it is): no product to run
  Lt& l = lt();
  static std::mutex mu;
  static std::map<Key, Plan> plans;
  const Plan* p;
  {
    std::lock_guard<std::mutex> lock(mu);
    const Key k{d.batch, d.M, d.N, d.K, d.ta, d.tb, d.ab_dtype, d.c_dtype, d.accumulate};
    auto it = plans.find(k);
    if (it == plans.end()) it = plans.emplace(k, make_plan(l, d)).first;
    p = &it->second;
  }
  const float alpha = 1.0f, beta = d.accumulate ? 1.0f : 0.0f;
  lt_check(l,
           l.cublasLtMatmul(l.handle, p->op, &alpha, b, p->a, a, p->b, &beta, c, p->c, c, p->c,
                            &p->algo, l.workspace, kWorkspace, s),
           "matmul");
}

}  // namespace loom::kernels::cuda
