// Rotary position embedding as a CUDA kernel, Hugging Face rotate-half convention, position =
// t0 + index along T (kernels/cpu/rope.cc's twin).
//
// A thread owns one (t, i) pair, i < HS/2: it computes the angle's cos and sin once, in f64
// (freq = sign * theta^(-2i/HS) and a = position * freq, as the CPU's f64 table), rounds them to
// f32, and rotates element pair (i, i + HS/2) of that position for a stride of the (b, h) heads;
// gridDim.y spreads the heads over blocks when T*HS/2 alone is too few threads. Does not cache
// the angles across calls.
// Invariant: each thread loads both elements of a pair before storing either, and no two threads
// touch the same pair, so y may alias x.
#include <algorithm>

#include "loom/kernels/cuda/common.cuh"

namespace loom::kernels::cuda {

namespace {

// x, y (B,T,NH,HS); t0: GPU scalar or null (0). BH = B*NH.
__global__ void rope_kernel(const float* x, float* y, int64_t T, int64_t NH, int64_t HS, int64_t BH,
                            float theta, int sign, const int32_t* t0) {
  const int64_t half = HS / 2;
  const int64_t first = t0 != nullptr ? int64_t(t0[0]) : 0;
  for (int64_t k = grid_start(); k < T * half; k += grid_step()) {
    const int64_t t = k / half, i = k - t * half;
    const double freq = double(sign) * pow(double(theta), -double(2 * i) / double(HS));
    double sd, cd;
    sincos(double(first + t) * freq, &sd, &cd);
    const float ca = float(cd), sa = float(sd);
    for (int64_t bh = blockIdx.y; bh < BH; bh += gridDim.y) {
      const int64_t b = bh / NH, h = bh - b * NH;
      const int64_t o = ((b * T + t) * NH + h) * HS + i;
      const float x0 = x[o], x1 = x[o + half];
      y[o] = x0 * ca - x1 * sa;
      y[o + half] = x1 * ca + x0 * sa;
    }
  }
}

}  // namespace

// x (B,T,NH,HS) -> y (B,T,NH,HS); y may alias x. For position p = t0 + t and i < HS/2,
// a = sign * p * theta^(-2i/HS):  y[i] = x[i] cos a - x[i+HS/2] sin a,
// y[i+HS/2] = x[i+HS/2] cos a + x[i] sin a.
void rope(const float* x, float* y, int64_t B, int64_t T, int64_t NH, int64_t HS, float theta,
          int sign, const int32_t* t0, Stream s) {
  if (HS % 2 != 0) check(cudaErrorInvalidValue, "rope: odd head size");
  if (sign != 1 && sign != -1) check(cudaErrorInvalidValue, "rope: sign not +1 or -1");
  const int64_t pairs = T * (HS / 2), BH = B * NH;
  if (pairs <= 0 || BH <= 0) return;
  // About 2^17 threads in all: heads go to gridDim.y only while the pairs alone are fewer.
  const int64_t want = (int64_t(1) << 17) / pairs;
  const dim3 grid(blocks_for(pairs),
                  unsigned(std::clamp<int64_t>(want, 1, std::min<int64_t>(BH, 65535))));
  rope_kernel<<<grid, kThreads, 0, s>>>(x, y, T, NH, HS, BH, theta, sign, t0);
  check_launch("rope");
}

}  // namespace loom::kernels::cuda
