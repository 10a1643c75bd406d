// Checks of every collective against a plain reference computed here, shared by the local backend's
// unit test (comm_test.cc, through run_local) and the MPI backend's program run under mpirun
// (mpi_check.cc), so that both backends pass the same checks.
//
// Each check is collective: every rank of `c` calls it with the same Options. It throws loom::Error
// naming the check, the rank, the first wrong element and both values.
// Not here: failure injection (abort, mismatched calls: comm_test.cc, local backend only), timing.
// Invariant: every input is a function of (seed, rank, index), so each rank computes the reference
// for all ranks without communicating; the reference sums in rank order 0,1,2,... (bf16 in f32,
// rounded once), exactly what the local backend promises.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/communicator.h"
#include "loom/core/error.h"

namespace loom::comm::checks {

struct Options {
  // true: random values of many magnitudes, compared bit for bit with the rank-order sum (the local
  // backend promises that order). false: small integers, whose sums are exact in any order (MPI
  // promises none), still compared bit for bit.
  bool rank_order = true;
};

using Bytes = std::vector<char>;

inline uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline uint64_t hash(uint64_t seed, int rank, int64_t i) {
  return mix(mix(seed) ^ mix(uint64_t(rank) + 0x1000) ^ uint64_t(i) * 0x2545F4914F6CDD1Dull);
}

// Element i of `rank`'s input: in [-1, 1) times 2^-4..2^3 (random), or an integer in [-16, 16].
inline float value(uint64_t seed, int rank, int64_t i, bool random) {
  const uint64_t h = hash(seed, rank, i);
  if (!random) return float(int64_t(h % 33) - 16);
  const float unit = float((h >> 40) & 0xffffff) / float(1 << 24) * 2.f - 1.f;
  return std::ldexp(unit, int((h >> 8) % 8) - 4);
}

// Elements [first, first + count) of `rank`'s input in dtype dt.
inline Bytes values(DType dt, uint64_t seed, int rank, int64_t first, int64_t count, bool random) {
  Bytes b(size_t(count) * dtype_size(dt));
  for (int64_t i = 0; i < count; ++i) {
    const float v = value(seed, rank, first + i, random);
    if (dt == DType::f32) std::memcpy(b.data() + 4 * i, &v, 4);
    if (dt == DType::bf16) {
      const bf16 h = f32_to_bf16(v);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
    if (dt == DType::i32) {
      const int32_t x = random ? int32_t(uint32_t(hash(seed, rank, first + i))) : int32_t(v);
      std::memcpy(b.data() + 4 * i, &x, 4);
    }
  }
  return b;
}

// The sum over `ranks`, in that order, of elements [first, first + count) of their inputs: f32 adds
// in f32, bf16 accumulates in f32 and rounds once, i32 wraps.
inline Bytes ordered_sum(DType dt, uint64_t seed, const std::vector<int>& ranks, int64_t first,
                         int64_t count, bool random) {
  std::vector<Bytes> in;
  for (int r : ranks) in.push_back(values(dt, seed, r, first, count, random));
  Bytes out(in[0].size());
  for (int64_t i = 0; i < count; ++i) {
    if (dt == DType::i32) {
      uint32_t acc = 0;
      for (const Bytes& b : in) {
        uint32_t x;
        std::memcpy(&x, b.data() + 4 * i, 4);
        acc += x;
      }
      std::memcpy(out.data() + 4 * i, &acc, 4);
      continue;
    }
    float acc = 0.f;
    for (size_t k = 0; k < in.size(); ++k) {
      float x;
      if (dt == DType::f32) {
        std::memcpy(&x, in[k].data() + 4 * i, 4);
      } else {
        bf16 h;
        std::memcpy(&h, in[k].data() + 2 * i, 2);
        x = bf16_to_f32(h);
      }
      acc = k == 0 ? x : acc + x;  // starts from the first term, not 0 (keeps -0)
    }
    if (dt == DType::f32)
      std::memcpy(out.data() + 4 * i, &acc, 4);
    else {
      const bf16 h = f32_to_bf16(acc);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

inline std::vector<int> all_ranks(int n) {
  std::vector<int> r(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) r[size_t(i)] = i;
  return r;
}

// Bytes [first, first + n) of the message rank `src` sends to rank `dst`.
inline Bytes pattern(uint64_t seed, int src, int dst, int64_t n) {
  Bytes b(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) b[size_t(i)] = char(hash(seed, src * 1000 + dst, i) >> 24);
  return b;
}

inline std::string show(const char* p, int elem) {
  if (elem == 4) {
    float f;
    int32_t x;
    std::memcpy(&f, p, 4);
    std::memcpy(&x, p, 4);
    return fmt::format("{:.9g} (0x{:08x}, i32 {})", f, uint32_t(x), x);
  }
  if (elem == 2) {
    bf16 h;
    std::memcpy(&h, p, 2);
    return fmt::format("{:.6g} (bf16 0x{:04x})", bf16_to_f32(h), h.bits);
  }
  return fmt::format("0x{:02x}", unsigned(uint8_t(*p)));
}

// Throws unless got == want bit for bit; `elem` is the element size used to print the first
// mismatch.
inline void expect_same(const std::string& what, const Communicator& c, const Bytes& got,
                        const Bytes& want, int elem) {
  if (got.size() != want.size())
    throw Error(fmt::format("{}: rank {} of {} ({}): {} bytes, expected {}", what, c.rank(),
                            c.size(), c.backend(), got.size(), want.size()));
  for (size_t i = 0; i < got.size(); i += size_t(elem))
    if (std::memcmp(got.data() + i, want.data() + i, size_t(elem)) != 0)
      throw Error(
          fmt::format("{}: rank {} of {} ({}, chunk_bytes {}): element {} is {}, expected {}", what,
                      c.rank(), c.size(), c.backend(), c.chunk_bytes(), i / size_t(elem),
                      show(got.data() + i, elem), show(want.data() + i, elem)));
}

// Throws unless every rank of c holds the same `mine` (the result of a reduction).
inline void expect_same_everywhere(const std::string& what, Communicator& c, const Bytes& mine) {
  Bytes all(mine.size() * size_t(c.size()));
  c.all_gather(mine.data(), all.data(), int64_t(mine.size()));
  for (int r = 0; r < c.size(); ++r)
    if (std::memcmp(all.data() + size_t(r) * mine.size(), mine.data(), mine.size()) != 0)
      throw Error(fmt::format("{}: rank {} of {} got different bits from rank {}", what, c.rank(),
                              c.size(), r));
}

inline const std::vector<int64_t>& counts() {
  static const std::vector<int64_t> k{1, 3, 64, 1001};
  return k;
}

inline void check_all_reduce(Communicator& c, const Options& o) {
  for (DType dt : {DType::f32, DType::bf16, DType::i32})
    for (int64_t n : counts()) {
      const uint64_t seed = 100 + uint64_t(n) * 3 + uint64_t(dt);
      const std::string what = fmt::format("all_reduce({}, {})", n, dtype_name(dt));
      Bytes buf = values(dt, seed, c.rank(), 0, n, o.rank_order);
      c.all_reduce(buf.data(), n, dt);
      expect_same(what, c, buf, ordered_sum(dt, seed, all_ranks(c.size()), 0, n, o.rank_order),
                  int(dtype_size(dt)));
      expect_same_everywhere(what, c, buf);
    }
}

inline void check_reduce_scatter(Communicator& c, const Options& o) {
  for (DType dt : {DType::f32, DType::bf16, DType::i32})
    for (int64_t n : counts()) {
      const uint64_t seed = 200 + uint64_t(n) * 3 + uint64_t(dt);
      Bytes in = values(dt, seed, c.rank(), 0, n * c.size(), o.rank_order);  // (size, n)
      Bytes out(size_t(n) * dtype_size(dt));
      c.reduce_scatter(in.data(), out.data(), n, dt);
      expect_same(fmt::format("reduce_scatter({}, {})", n, dtype_name(dt)), c, out,
                  ordered_sum(dt, seed, all_ranks(c.size()), c.rank() * n, n, o.rank_order),
                  int(dtype_size(dt)));
    }
}

inline void check_all_gather(Communicator& c, const Options&) {
  for (int64_t n : counts()) {
    Bytes in = pattern(300 + uint64_t(n), c.rank(), -1, n), out(size_t(n * c.size())), want;
    c.all_gather(in.data(), out.data(), n);
    for (int r = 0; r < c.size(); ++r) {
      Bytes b = pattern(300 + uint64_t(n), r, -1, n);
      want.insert(want.end(), b.begin(), b.end());
    }
    expect_same(fmt::format("all_gather({})", n), c, out, want, 1);
  }
}

inline void check_broadcast(Communicator& c, const Options&) {
  for (int root = 0; root < c.size(); ++root)
    for (int64_t n : counts()) {
      Bytes buf = pattern(400 + uint64_t(n), c.rank(), -1, n);
      c.broadcast(buf.data(), n, root);
      expect_same(fmt::format("broadcast({}, root {})", n, root), c, buf,
                  pattern(400 + uint64_t(n), root, -1, n), 1);
    }
}

inline void check_all_to_all(Communicator& c, const Options&) {
  for (int64_t n : counts()) {
    Bytes in, want, out(size_t(n * c.size()));
    for (int j = 0; j < c.size(); ++j) {
      Bytes b = pattern(500 + uint64_t(n), c.rank(), j, n),
            w = pattern(500 + uint64_t(n), j, c.rank(), n);
      in.insert(in.end(), b.begin(), b.end());
      want.insert(want.end(), w.begin(), w.end());
    }
    c.all_to_all(in.data(), out.data(), n);
    expect_same(fmt::format("all_to_all({})", n), c, out, want, 1);
  }
}

// Each rank sends to the next and receives from the previous; even ranks send first, so blocking
// sends cannot deadlock (with 1 rank, a rank sends to itself: buffered on local, small on MPI).
inline void check_send_recv_ring(Communicator& c, const Options&) {
  const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
  for (int64_t n : counts()) {
    const uint64_t seed = 600 + uint64_t(n);
    Bytes out = pattern(seed, c.rank(), next, n), in(static_cast<size_t>(n));
    if (c.rank() % 2 == 0) {
      c.send(out.data(), n, next, 7);
      c.recv(in.data(), n, prev, 7);
    } else {
      c.recv(in.data(), n, prev, 7);
      c.send(out.data(), n, next, 7);
    }
    expect_same(fmt::format("send/recv ring({})", n), c, in, pattern(seed, prev, c.rank(), n), 1);
  }
  c.barrier();
}

// Every collective at chunk_bytes 12 and 64 (counts not multiples of a piece) gives the same bits
// as unchunked. Restores c's chunk_bytes.
inline void check_chunking(Communicator& c, const Options& o) {
  const int64_t saved = c.chunk_bytes();
  const int64_t n = 1001;
  auto run_all = [&] {
    std::vector<Bytes> r;
    for (DType dt : {DType::f32, DType::bf16}) {
      Bytes buf = values(dt, 700, c.rank(), 0, n, o.rank_order);
      c.all_reduce(buf.data(), n, dt);
      r.push_back(buf);
      Bytes in = values(dt, 701, c.rank(), 0, n * c.size(), o.rank_order),
            out(size_t(n) * dtype_size(dt));
      c.reduce_scatter(in.data(), out.data(), n, dt);
      r.push_back(out);
    }
    Bytes in = pattern(702, c.rank(), -1, n * c.size()), out(size_t(n * c.size()));
    c.all_gather(in.data(), out.data(), n);
    r.push_back(out);
    c.all_to_all(in.data(), out.data(), n);
    r.push_back(out);
    c.broadcast(in.data(), n, c.size() - 1);
    r.push_back(in);
    return r;
  };
  const int64_t saved_gather = c.gather_chunk_bytes();
  c.set_chunk_bytes(kDefaultChunkBytes);
  c.set_gather_chunk_bytes(kMaxChunkBytes);
  const std::vector<Bytes> whole = run_all();
  for (int64_t chunk : {12, 64}) {
    c.set_chunk_bytes(chunk);
    c.set_gather_chunk_bytes(chunk);
    const std::vector<Bytes> pieces = run_all();
    for (size_t k = 0; k < whole.size(); ++k)
      expect_same(fmt::format("chunking: result {} at chunk_bytes {}", k, chunk), c, pieces[k],
                  whole[k], 1);
  }
  c.set_chunk_bytes(saved);
  c.set_gather_chunk_bytes(saved_gather);
}

// Split by parity with the key reversing the order; the last rank (when there are 2 or more) passes
// a negative color and gets no communicator.
inline void check_split(Communicator& c, const Options& o) {
  const int n = c.size(), me = c.rank();
  const bool out = n >= 2 && me == n - 1;
  std::unique_ptr<Communicator> sub = c.split(out ? -1 : me % 2, -me);
  if (out) {
    if (sub) throw Error(fmt::format("split: rank {} passed color -1 and got a communicator", me));
    return;
  }
  std::vector<int> members;  // by key = -rank: descending old rank
  for (int r = n - 1; r >= 0; --r)
    if (r % 2 == me % 2 && !(n >= 2 && r == n - 1)) members.push_back(r);
  const int want_rank = int(std::find(members.begin(), members.end(), me) - members.begin());
  if (!sub || sub->size() != int(members.size()) || sub->rank() != want_rank ||
      sub->backend() != c.backend() || sub->chunk_bytes() != c.chunk_bytes())
    throw Error(fmt::format("split: rank {} expected rank {} of {} ({}), got {}", me, want_rank,
                            members.size(), c.backend(),
                            sub ? fmt::format("rank {} of {} ({}, chunk_bytes {})", sub->rank(),
                                              sub->size(), sub->backend(), sub->chunk_bytes())
                                : "none"));
  Bytes buf = values(DType::f32, 800, me, 0, 101, o.rank_order);
  sub->all_reduce(buf.data(), 101, DType::f32);
  expect_same("split: all_reduce", *sub, buf,
              ordered_sum(DType::f32, 800, members, 0, 101, o.rank_order), 4);
  int32_t mine = me;
  std::vector<int32_t> got(members.size());
  sub->all_gather(&mine, got.data(), 4);
  for (size_t k = 0; k < members.size(); ++k)
    if (got[k] != members[k])
      throw Error(fmt::format("split: rank {}: member {} is old rank {}, expected {}", me, k,
                              got[k], members[k]));
}

// Rows and columns of a 2x2 mesh (rank = 2*row + col), with collectives on each, interleaved with
// the parent's. Needs 4 ranks.
inline void check_mesh_2x2(Communicator& c, const Options& o) {
  if (c.size() != 4) throw Error(fmt::format("mesh 2x2: needs 4 ranks, has {}", c.size()));
  const int row = c.rank() / 2, col = c.rank() % 2;
  std::unique_ptr<Communicator> rows = c.split(row, col), cols = c.split(col, row);
  if (!rows || !cols || rows->size() != 2 || cols->size() != 2 || rows->rank() != col ||
      cols->rank() != row)
    throw Error(fmt::format("mesh 2x2: rank {}: wrong row/column communicators", c.rank()));
  const std::vector<int> row_ranks{2 * row, 2 * row + 1}, col_ranks{col, 2 + col};
  for (DType dt : {DType::f32, DType::bf16}) {
    const int64_t n = 77;
    Bytes buf = values(dt, 900, c.rank(), 0, n, o.rank_order);
    rows->all_reduce(buf.data(), n, dt);
    expect_same("mesh 2x2: row all_reduce", *rows, buf,
                ordered_sum(dt, 900, row_ranks, 0, n, o.rank_order), int(dtype_size(dt)));
    c.barrier();
    Bytes in = values(dt, 901, c.rank(), 0, 2 * n, o.rank_order), out(size_t(n) * dtype_size(dt));
    cols->reduce_scatter(in.data(), out.data(), n, dt);
    expect_same("mesh 2x2: column reduce_scatter", *cols, out,
                ordered_sum(dt, 901, col_ranks, row * n, n, o.rank_order), int(dtype_size(dt)));
  }
  int32_t mine = c.rank(), got[2];
  cols->all_gather(&mine, got, 4);
  if (got[0] != col || got[1] != 2 + col)
    throw Error(
        fmt::format("mesh 2x2: rank {}: column all_gather gave {} {}", c.rank(), got[0], got[1]));
  Bytes b = pattern(902, c.rank(), -1, 50);
  rows->broadcast(b.data(), 50, 1);
  expect_same("mesh 2x2: row broadcast", *rows, b, pattern(902, 2 * row + 1, -1, 50), 1);
  Bytes a2a_in, a2a_want, a2a_out(2 * 9);
  for (int j = 0; j < 2; ++j) {
    Bytes x = pattern(903, c.rank(), col_ranks[size_t(j)], 9),
          w = pattern(903, col_ranks[size_t(j)], c.rank(), 9);
    a2a_in.insert(a2a_in.end(), x.begin(), x.end());
    a2a_want.insert(a2a_want.end(), w.begin(), w.end());
  }
  cols->all_to_all(a2a_in.data(), a2a_out.data(), 9);
  expect_same("mesh 2x2: column all_to_all", *cols, a2a_out, a2a_want, 1);
  // a split of a split: the row again, in reverse order
  std::unique_ptr<Communicator> rev = rows->split(0, -rows->rank());
  if (!rev || rev->rank() != 1 - col)
    throw Error(fmt::format("mesh 2x2: rank {}: split of a row", c.rank()));
  rev->barrier();
  rows->barrier();
  cols->barrier();
}

inline void run_all(Communicator& c, const Options& o) {
  check_all_reduce(c, o);
  check_reduce_scatter(c, o);
  check_all_gather(c, o);
  check_broadcast(c, o);
  check_all_to_all(c, o);
  check_send_recv_ring(c, o);
  c.barrier();
  check_split(c, o);
  if (c.size() == 4) check_mesh_2x2(c, o);
}

}  // namespace loom::comm::checks
