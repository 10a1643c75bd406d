// Trace: what a rank's executor did and when, on two lanes, written as a Chrome trace (the JSON
// Perfetto and chrome://tracing open).
//
// Lanes: compute (the executor's thread: every kernel, and every wait for communication, named
// "wait <value>", which is the communication compute was exposed to) and comm (each collective
// from its start to its end, on the communication thread, runtime/comm_stream.h, or on the compute
// thread when the program has no asynchronous collective). An event carries the node's output
// name, its op and the bytes of its outputs.
//
// Times are microseconds of std::chrono::steady_clock (CLOCK_MONOTONIC on Linux): the ranks of one
// machine share it, so their events line up; chrome_trace() shifts them to start at 0. Ranks on
// different machines would need their clocks aligned first (not done: Loom's multi-host runs here
// are namespaces of one kernel).
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace loom::runtime {

struct TraceEvent {
  enum Lane : uint8_t { compute = 0, comm = 1 };
  std::string name, op;
  Lane lane = compute;
  double start_us = 0, dur_us = 0;
  int64_t bytes = 0;
};

class Trace {
 public:
  static double now_us();
  void add(TraceEvent e);  // thread-safe: the compute and the communication thread both add
  std::vector<TraceEvent> events() const;

 private:
  mutable std::mutex mu_;
  std::vector<TraceEvent> events_;
};

// The Chrome trace of every rank's events (per_rank[r]: rank r's): one process per rank ("rank r")
// with two threads ("compute", "comm"), complete events ("ph": "X") with args {op, bytes}, times
// shifted so the earliest event starts at 0.
nlohmann::json chrome_trace(const std::vector<std::vector<TraceEvent>>& per_rank);
// The events as a JSON array (to gather them on one rank) and back.
nlohmann::json trace_events_json(const std::vector<TraceEvent>& events);
std::vector<TraceEvent> trace_events_from_json(const nlohmann::json& j);

class MeshComms;
// Every rank's events gathered to rank 0, which writes their Chrome trace to `path` atomically
// (core/file.h). Collective when comms is non-null (every rank calls it; rank 0 writes). Throws
// loom::Error naming the path when it cannot be written.
void write_trace(const std::string& path, const Trace& trace, const MeshComms* comms);

}  // namespace loom::runtime
