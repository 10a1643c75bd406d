// Elementwise CUDA kernels: add, add_bias, mul, scale, mul_scalar, the f32 <-> bf16 casts, fill,
// positions, the two broadcasts and the device-to-device copy (kernels/cpu/elementwise.cc's twins).
//
// Every kernel is a grid-stride loop over int64 indices (n may be 0: the loop does nothing); add
// and the two casts, the bulk of a bf16 step's memory-bound work, move 4 elements per access
// (16-byte f32, 8-byte bf16) when every pointer is so aligned, with the same arithmetic per
// element; add_bias too, when its rows are so aligned. No broadcasting beyond what each op names.
// Invariant: y[i] depends only on the inputs at i (or a fixed index of them), so y == a exactly in
// place is safe; partial overlap is not.
#include "loom/kernels/cuda/common.cuh"

namespace loom::kernels::cuda {

namespace {

// Bit-identical to loom::f32_to_bf16: round to nearest even; NaN -> quiet NaN keeping the sign and
// the top payload bits.
__device__ __forceinline__ bf16 f32_to_bf16_exact(float x) {
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40u)};
  return bf16{uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}

__global__ void add_kernel(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_step()) y[i] = a[i] + b[i];
}

// 4 elements per access, then the tail (n % 4) one by one.
__global__ void add4_kernel(const float* a, const float* b, float* y, int64_t n) {
  const int64_t n4 = n / 4;
  for (int64_t i = grid_start(); i < n4; i += grid_step()) {
    const float4 x = reinterpret_cast<const float4*>(a)[i];
    const float4 z = reinterpret_cast<const float4*>(b)[i];
    reinterpret_cast<float4*>(y)[i] = make_float4(x.x + z.x, x.y + z.y, x.z + z.z, x.w + z.w);
  }
  for (int64_t i = 4 * n4 + grid_start(); i < n; i += grid_step()) y[i] = a[i] + b[i];
}

// A grid-stride loop's column in rows of C: the start's, then advanced by the fixed step's
// remainder with one compare, so no division runs per element (an int64 % costs more than the
// element's memory traffic).
struct Column {
  int64_t c, dc, C;
  __device__ Column(int64_t i, int64_t step, int64_t C_) : c(i % C_), dc(step % C_), C(C_) {}
  __device__ void next() {
    c += dc;
    if (c >= C) c -= C;
  }
};

// a (N,C), b (C) -> y (N,C); n = N*C
__global__ void add_bias_kernel(const float* a, const float* b, float* y, int64_t n, int64_t C) {
  Column col(grid_start(), grid_step(), C);
  for (int64_t i = grid_start(); i < n; i += grid_step(), col.next()) y[i] = a[i] + b[col.c];
}

// add_bias 4 columns per access: C % 4 == 0, pointers 16-byte aligned; n4 = N*C/4, C4 = C/4
__global__ void add_bias4_kernel(const float4* a, const float4* b, float4* y, int64_t n4,
                                 int64_t C4) {
  Column col(grid_start(), grid_step(), C4);
  for (int64_t i = grid_start(); i < n4; i += grid_step(), col.next()) {
    const float4 x = a[i], z = b[col.c];
    y[i] = make_float4(x.x + z.x, x.y + z.y, x.z + z.z, x.w + z.w);
  }
}

__global__ void mul_kernel(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_step()) y[i] = a[i] * b[i];
}

__global__ void scale_kernel(const float* a, float k, float* y, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_step()) y[i] = a[i] * k;
}

// k: a GPU scalar, read once per thread
__global__ void mul_scalar_kernel(const float* a, const float* k, float* y, int64_t n) {
  const float kv = k[0];
  for (int64_t i = grid_start(); i < n; i += grid_step()) y[i] = a[i] * kv;
}

__global__ void cast_f32_bf16_kernel(const float* x, bf16* y, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_step()) y[i] = f32_to_bf16_exact(x[i]);
}

__global__ void cast_bf16_f32_kernel(const bf16* x, float* y, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_step()) y[i] = to_f32(x[i]);
}

__global__ void cast4_f32_bf16_kernel(const float* x, bf16* y, int64_t n) {
  const int64_t n4 = n / 4;
  for (int64_t i = grid_start(); i < n4; i += grid_step()) {
    const float4 v = reinterpret_cast<const float4*>(x)[i];
    const uint32_t lo =
        uint32_t(f32_to_bf16_exact(v.x).bits) | uint32_t(f32_to_bf16_exact(v.y).bits) << 16;
    const uint32_t hi =
        uint32_t(f32_to_bf16_exact(v.z).bits) | uint32_t(f32_to_bf16_exact(v.w).bits) << 16;
    reinterpret_cast<uint2*>(y)[i] = make_uint2(lo, hi);
  }
  for (int64_t i = 4 * n4 + grid_start(); i < n; i += grid_step()) y[i] = f32_to_bf16_exact(x[i]);
}

__global__ void cast4_bf16_f32_kernel(const bf16* x, float* y, int64_t n) {
  const int64_t n4 = n / 4;
  for (int64_t i = grid_start(); i < n4; i += grid_step()) {
    const uint2 v = reinterpret_cast<const uint2*>(x)[i];
    reinterpret_cast<float4*>(y)[i] =
        make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                    __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u));
  }
  for (int64_t i = 4 * n4 + grid_start(); i < n; i += grid_step()) y[i] = to_f32(x[i]);
}

template <class T>
__global__ void fill_kernel(T* y, T value, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_step()) y[i] = value;
}

// y (rows,T) = t0[0] + t; n = rows*T
__global__ void positions_kernel(int32_t* y, int64_t n, int64_t T, const int32_t* t0) {
  const int32_t base = t0 != nullptr ? t0[0] : 0;
  for (int64_t i = grid_start(); i < n; i += grid_step()) y[i] = base + int32_t(i % T);
}

__global__ void broadcast_scalar_kernel(const float* x, float* y, int64_t n) {
  const float v = x[0];
  for (int64_t i = grid_start(); i < n; i += grid_step()) y[i] = v;
}

// x (C) -> y (rows,C); n = rows*C
__global__ void broadcast_rows_kernel(const float* x, float* y, int64_t n, int64_t C) {
  Column col(grid_start(), grid_step(), C);
  for (int64_t i = grid_start(); i < n; i += grid_step(), col.next()) y[i] = x[col.c];
}

}  // namespace

// a, b (n) -> y (n) = a + b
void add(const float* a, const float* b, float* y, int64_t n, Stream s) {
  if (aligned(16, {a, b, y}))
    add4_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, s>>>(a, b, y, n);
  else
    add_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, b, y, n);
  check_launch("add");
}

// a (N,C), b (C) -> y (N,C) = a + b broadcast over rows
void add_bias(const float* a, const float* b, float* y, int64_t N, int64_t C, Stream s) {
  if (C <= 0 || N <= 0) return;
  if (C % 4 == 0 && aligned(16, {a, b, y}))
    add_bias4_kernel<<<blocks_for(N * C / 4), kThreads, 0, s>>>(
        reinterpret_cast<const float4*>(a), reinterpret_cast<const float4*>(b),
        reinterpret_cast<float4*>(y), N * C / 4, C / 4);
  else
    add_bias_kernel<<<blocks_for(N * C), kThreads, 0, s>>>(a, b, y, N * C, C);
  check_launch("add_bias");
}

// a, b (n) -> y (n) = a * b
void mul(const float* a, const float* b, float* y, int64_t n, Stream s) {
  mul_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, b, y, n);
  check_launch("mul");
}

// a (n) -> y (n) = a * k
void scale(const float* a, float k, float* y, int64_t n, Stream s) {
  scale_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, k, y, n);
  check_launch("scale");
}

// a (n), k (1, GPU) -> y (n) = a * k[0]
void mul_scalar(const float* a, const float* k, float* y, int64_t n, Stream s) {
  if (n <= 0) return;  // k is not read when there is nothing to scale
  mul_scalar_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, k, y, n);
  check_launch("mul_scalar");
}

// x (n) -> y (n), round to nearest even
void cast_f32_bf16(const float* x, bf16* y, int64_t n, Stream s) {
  if (aligned(16, {x}) && aligned(8, {y}))
    cast4_f32_bf16_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, s>>>(x, y, n);
  else
    cast_f32_bf16_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, y, n);
  check_launch("cast_f32_bf16");
}

// x (n) -> y (n), exact
void cast_bf16_f32(const bf16* x, float* y, int64_t n, Stream s) {
  if (aligned(8, {x}) && aligned(16, {y}))
    cast4_bf16_f32_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, s>>>(x, y, n);
  else
    cast_bf16_f32_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, y, n);
  check_launch("cast_bf16_f32");
}

// y (n) = value, as f32 (elem 4) or bf16 (elem 2, value rounded to nearest even)
void fill(void* y, float value, int64_t n, int elem, Stream s) {
  if (elem == 4) {
    fill_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<float*>(y), value, n);
  } else if (elem == 2) {
    fill_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<bf16*>(y), f32_to_bf16(value), n);
  } else {
    check(cudaErrorInvalidValue, "fill: element size not 4 (f32) or 2 (bf16)");
  }
  check_launch("fill");
}

// y (rows,T) of int32 = t0[0] + t (t0 null: 0)
void positions(int32_t* y, int64_t rows, int64_t T, const int32_t* t0, Stream s) {
  if (rows <= 0 || T <= 0) return;
  positions_kernel<<<blocks_for(rows * T), kThreads, 0, s>>>(y, rows * T, T, t0);
  check_launch("positions");
}

// x (1) -> y (n) = x[0]
void broadcast_scalar(const float* x, float* y, int64_t n, Stream s) {
  if (n <= 0) return;
  broadcast_scalar_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, y, n);
  check_launch("broadcast_scalar");
}

// x (C) -> y (rows,C): every row a copy of x
void broadcast_rows(const float* x, float* y, int64_t rows, int64_t C, Stream s) {
  if (rows <= 0 || C <= 0) return;
  broadcast_rows_kernel<<<blocks_for(rows * C), kThreads, 0, s>>>(x, y, rows * C, C);
  check_launch("broadcast_rows");
}

// y (bytes) = x (bytes), device to device on s; nothing to do for 0 bytes or y == x
void copy(void* y, const void* x, int64_t bytes, Stream s) {
  if (bytes <= 0 || y == x) return;
  check(cudaMemcpyAsync(y, x, size_t(bytes), cudaMemcpyDeviceToDevice, s),
        "copy (cudaMemcpyAsync)");
}

}  // namespace loom::kernels::cuda
