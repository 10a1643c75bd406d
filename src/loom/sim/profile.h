// A calibrated profile: kernel times measured on this machine by `loom calibrate`
// (calibrate/calibrate.h), stored in the cluster file's [profile] section, and read back by the
// cost model (cost.h) to predict a node's time from the samples of its op.
//
//   matmul   one sample per (transpose pattern, m, n, k, dtype): the seconds of one GEMM
//   other    one sample per (op, dtype, size): the seconds of one node and the bytes it moved
//            (its Cost's bytes read + written) and FLOPs; a node is predicted from the samples
//            of its op, interpolated in bytes (or FLOPs for attention) on a log-log scale;
//            where measured (a GPU's `loom bench --kernels-out`), also the largest temporary one
//            call took beside the memory plan (stream-ordered scratch: cuDNN's workspace), which
//            the simulator's peak memory adds the largest of
//   comm     per collective kind and rank count: the seconds of one collective of a given size
//            on this machine's shared memory (`local` threads or MPI ranks)
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loom/core/dtype.h"
#include "loom/ir/op.h"

namespace loom::sim {

struct MatmulSample {
  int64_t ta = 0, tb = 0;  // transposes, as the matmul op's attributes
  int64_t m = 0, n = 0, k = 0, batch = 1;
  DType dtype = DType::f32;
  double seconds = 0;
};

struct OpSample {
  DType dtype = DType::f32;
  double bytes = 0;  // read + written (ops::Cost)
  double flops = 0;
  double seconds = 0;
  double scratch_bytes = 0;  // 0: none taken, or not measured
};

struct CommSample {
  int64_t ranks = 0;
  double bytes = 0;  // the collective's input bytes per rank
  double seconds = 0;
};

struct Profile {
  int64_t threads = 1;  // OpenMP threads per rank when measured
  std::vector<MatmulSample> matmul;
  std::map<ir::Op, std::vector<OpSample>> ops;     // op -> samples, by increasing bytes
  std::map<ir::Op, std::vector<CommSample>> comm;  // collective op -> samples
};

}  // namespace loom::sim
