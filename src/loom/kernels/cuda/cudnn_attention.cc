// cuDNN's fused SDPA for bf16 causal attention (cudnn_attention.h), built with the header-only
// cudnn-frontend (scripts/setup_cuda.sh installs it and cuDNN's headers): the frontend's graph API
// describes the operation, cuDNN picks and compiles its kernels. cuDNN is opened with dlopen from
// the GPU machine's own installation, as cuBLASLt is (cublaslt.cc): the build needs its headers
// only, CI and the CPU machines no library.
//
// One graph per (direction, shape, scale), made on first use and kept: made on a step's first,
// uncaptured run (a CUDA graph records later runs), so no allocation or compilation happens under
// capture; the workspace a graph asks for is stream-ordered scratch around each call. Loom's
// (B,T,heads,HS) layouts are cuDNN's (B,heads,T,HS) dimensions with strides; the statistics cuDNN
// writes in the forward and reads in the backward are the log-sum-exp in natural log, Loom's lse.
//
// Where cuDNN is looked for: $LOOM_CUDNN (a file), else "libcudnn.so.9" through the loader's
// search path (scripts/gpu_check.sh adds the directory of the GPU machine's Python package
// nvidia-cudnn). cuDNN's engines may need libnvrtc and the frontend libcudart.so.13 from the same
// installation (the package nvidia-cuda-runtime's directory on LD_LIBRARY_PATH).
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include "loom/kernels/cuda/cudnn_attention.h"

#include <cuda_runtime_api.h>
#include <cudnn_frontend.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <atomic>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "loom/core/error.h"
#include "loom/kernels/cuda/cuda_check.h"
#include "loom/kernels/cuda/kernels.h"

// the frontend's dynamic loading resolves every cuDNN entry point from this handle
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace loom::kernels::cuda {

namespace {

namespace fe = cudnn_frontend;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

struct Library {
  bool open = false;
  std::string why;  // why it did not open
  cudnnHandle_t handle = nullptr;
};

Library open_library() {
  Library lib;
  const char* env = std::getenv("LOOM_CUDNN");
  const std::string from = env && *env ? env : "libcudnn.so.9";
  void* h = dlopen(from.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* err = dlerror();
    lib.why = fmt::format(
        "cannot open {} ({}); looked in $LOOM_CUDNN, LD_LIBRARY_PATH and the loader's default "
        "paths (the Python package nvidia-cudnn has it under nvidia/cudnn/lib)",
        from, err ? err : "?");
    return lib;
  }
  fe::cudnn_dlhandle = h;
  try {
    if (fe::detail::create_handle(&lib.handle) != CUDNN_STATUS_SUCCESS) {
      lib.why = fmt::format("{} opened, but cudnnCreate failed", from);
      return lib;
    }
  } catch (const std::exception& e) {  // the frontend throws where a symbol is missing
    lib.why = fmt::format("{}: {}", from, e.what());
    return lib;
  }
  lib.open = true;
  return lib;
}

Library& library() {
  static Library lib = open_library();
  return lib;
}

// One direction and shape's graph; supported == false when cuDNN declined it (tried once).
struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  bool supported = false;
};

using Key = std::tuple<bool, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t>;

std::mutex& plans_mutex() {
  static std::mutex m;
  return m;
}
std::map<Key, Plan>& plans() {
  static std::map<Key, Plan> p;
  return p;
}

Plan make_plan(bool forward, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
               float scale) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  // (B,T,H,HS) in memory as cuDNN's (B,H,T,HS); the statistics (B,NH,T) f32
  const auto bthd = [&](fe::graph::Tensor_attributes& t, int64_t uid, int64_t H) {
    t.set_uid(uid).set_dim({B, H, T, HS}).set_stride({T * H * HS, HS, H * HS, 1});
  };
  const auto stats = [&](fe::graph::Tensor_attributes& t) {
    t.set_uid(kStats)
        .set_dim({B, NH, T, 1})
        .set_stride({NH * T, T, 1, 1})
        .set_data_type(fe::DataType_t::FLOAT);
  };
  const auto input = [&](const char* name, int64_t uid, int64_t H) {
    fe::graph::Tensor_attributes t;
    t.set_name(name);
    if (uid == kStats)
      stats(t);
    else
      bthd(t, uid, H);
    return g->tensor(t);
  };
  auto q = input("q", kQ, NH), k = input("k", kK, NKV), v = input("v", kV, NKV);
  if (forward) {
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("loom_attention_fwd")
                    .set_generate_stats(true)
                    .set_attn_scale(scale)
                    .set_causal_mask(true);
    auto [o, st] = g->sdpa(q, k, v, opts);
    bthd(o->set_output(true), kO, NH);
    stats(st->set_output(true));
  } else {
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("loom_attention_bwd")
                    .set_attn_scale(scale)
                    .set_causal_mask(true)
                    .set_deterministic_algorithm(true);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, input("o", kO, NH), input("dout", kdO, NH),
                                         input("stats", kStats, NH), opts);
    bthd(dq->set_output(true), kdQ, NH);
    bthd(dk->set_output(true), kdK, NKV);
    bthd(dv->set_output(true), kdV, NKV);
  }
  Plan p;
  const auto declined = [&](const std::string& msg) {
    std::fprintf(stderr,
                 "loom: cuDNN's attention %s does not take B %lld T %lld heads %lld/%lld HS %lld "
                 "(%s): Loom's own kernels run it\n",
                 forward ? "forward" : "backward", static_cast<long long>(B),
                 static_cast<long long>(T), static_cast<long long>(NH), static_cast<long long>(NKV),
                 static_cast<long long>(HS), msg.c_str());
    return p;
  };
  cudnnHandle_t h = library().handle;
  try {
    if (auto e = g->validate(); e.is_bad()) return declined(e.get_message());
    if (auto e = g->build_operation_graph(h); e.is_bad()) return declined(e.get_message());
    if (auto e = g->create_execution_plans({fe::HeurMode_t::A}); e.is_bad())
      return declined(e.get_message());
    if (auto e = g->check_support(h); e.is_bad()) return declined(e.get_message());
    if (auto e = g->build_plans(h); e.is_bad()) return declined(e.get_message());
    if (auto e = g->get_workspace_size(p.workspace); e.is_bad()) return declined(e.get_message());
  } catch (const std::exception& e) {
    return declined(e.what());
  }
  p.graph = std::move(g);
  p.supported = true;
  return p;
}

bool aligned(const void* const* ptrs, int n) {
  for (int i = 0; i < n; ++i)
    if (reinterpret_cast<uintptr_t>(ptrs[i]) % 16 != 0) return false;
  return true;
}

// The plan for this call, or nullptr where cuDNN does not take it.
const Plan* plan_for(bool forward, int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS,
                     float scale, const void* const* ptrs, int n) {
  if (HS % 8 != 0 || HS > 128 || !aligned(ptrs, n)) return nullptr;
  const Key key{forward, B, T, NH, NKV, HS, std::bit_cast<uint32_t>(scale)};
  std::lock_guard<std::mutex> lock(plans_mutex());
  auto it = plans().find(key);
  if (it == plans().end())
    it = plans().emplace(key, make_plan(forward, B, T, NH, NKV, HS, scale)).first;
  return it->second.supported ? &it->second : nullptr;
}

void execute(const Plan& p, std::unordered_map<int64_t, void*>& pack, CUstream_st* s,
             const char* what) {
  cudnnHandle_t h = library().handle;
  if (fe::detail::set_stream(h, s) != CUDNN_STATUS_SUCCESS)
    throw Error(fmt::format("cuDNN: {}: cudnnSetStream failed", what));
  void* ws = nullptr;
  note_scratch(p.workspace);
  if (p.workspace > 0)
    check(int(cudaMallocAsync(&ws, size_t(p.workspace), s)), "cuDNN attention's workspace");
  fe::error_t e;
  try {
    e = p.graph->execute(h, pack, ws);
  } catch (const std::exception& x) {
    e = {fe::error_code_t::GRAPH_EXECUTION_FAILED, x.what()};
  }
  if (ws) check(int(cudaFreeAsync(ws, s)), "cuDNN attention's workspace");
  if (e.is_bad()) throw Error(fmt::format("cuDNN: {}: {}", what, e.get_message()));
}

AttentionKernels from_env() {
  const char* v = std::getenv("LOOM_CUDA_ATTENTION");
  if (v == nullptr || *v == 0) return AttentionKernels::automatic;
  if (std::strcmp(v, "cudnn") == 0) return AttentionKernels::cudnn;
  if (std::strcmp(v, "flash") == 0) return AttentionKernels::flash;
  if (std::strcmp(v, "row") == 0) return AttentionKernels::row;
  throw Error(fmt::format("LOOM_CUDA_ATTENTION is \"{}\": it must be cudnn, flash or row", v));
}

std::atomic<AttentionKernels>& choice() {
  static std::atomic<AttentionKernels> c{from_env()};
  return c;
}

}  // namespace

void set_attention_kernels(AttentionKernels k) { choice().store(k); }
AttentionKernels attention_kernels() { return choice().load(); }

bool use_cudnn_attention() {
  const AttentionKernels k = attention_kernels();
  if (k == AttentionKernels::flash || k == AttentionKernels::row) return false;
  if (k == AttentionKernels::automatic) return library().open;
  if (!library().open)
    throw Error("attention on cuDNN was asked for (LOOM_CUDA_ATTENTION=cudnn), but " +
                library().why);
  return true;
}

bool cudnn_attention_fwd(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                         int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HS, float scale,
                         CUstream_st* s) {
  const void* ptrs[] = {q, k, v, o, lse};
  const Plan* p = plan_for(true, B, T, NH, NKV, HS, scale, ptrs, 5);
  if (!p) return false;
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<bf16*>(q)},
                                          {kK, const_cast<bf16*>(k)},
                                          {kV, const_cast<bf16*>(v)},
                                          {kO, o},
                                          {kStats, lse}};
  execute(*p, pack, s, "attention forward");
  return true;
}

bool cudnn_attention_bwd(const bf16* dout, const bf16* q, const bf16* k, const bf16* v,
                         const bf16* o, const float* lse, bf16* dq, bf16* dk, bf16* dv, int64_t B,
                         int64_t T, int64_t NH, int64_t NKV, int64_t HS, float scale,
                         CUstream_st* s) {
  const void* ptrs[] = {dout, q, k, v, o, lse, dq, dk, dv};
  const Plan* p = plan_for(false, B, T, NH, NKV, HS, scale, ptrs, 9);
  if (!p) return false;
  std::unordered_map<int64_t, void*> pack{{kQ, const_cast<bf16*>(q)},
                                          {kK, const_cast<bf16*>(k)},
                                          {kV, const_cast<bf16*>(v)},
                                          {kO, const_cast<bf16*>(o)},
                                          {kdO, const_cast<bf16*>(dout)},
                                          {kStats, const_cast<float*>(lse)},
                                          {kdQ, dq},
                                          {kdK, dk},
                                          {kdV, dv}};
  execute(*p, pack, s, "attention backward");
  return true;
}

}  // namespace loom::kernels::cuda
