#include "loom/runtime/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/runtime/collectives.h"

namespace loom::runtime {

double Trace::now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void Trace::add(TraceEvent e) {
  std::lock_guard<std::mutex> l(mu_);
  events_.push_back(std::move(e));
}

std::vector<TraceEvent> Trace::events() const {
  std::lock_guard<std::mutex> l(mu_);
  return events_;
}

nlohmann::json chrome_trace(const std::vector<std::vector<TraceEvent>>& per_rank) {
  double t0 = std::numeric_limits<double>::infinity();
  for (const auto& evs : per_rank)
    for (const TraceEvent& e : evs) t0 = std::min(t0, e.start_us);
  if (!std::isfinite(t0)) t0 = 0;
  nlohmann::json out = nlohmann::json::array();
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const int pid = int(r);
    out.push_back({{"ph", "M"},
                   {"name", "process_name"},
                   {"pid", pid},
                   {"args", {{"name", "rank " + std::to_string(r)}}}});
    for (int lane : {0, 1})
      out.push_back({{"ph", "M"},
                     {"name", "thread_name"},
                     {"pid", pid},
                     {"tid", lane},
                     {"args", {{"name", lane == TraceEvent::compute ? "compute" : "comm"}}}});
    for (const TraceEvent& e : per_rank[r])
      out.push_back({{"ph", "X"},
                     {"name", e.name},
                     {"cat", e.lane == TraceEvent::compute ? "compute" : "comm"},
                     {"pid", pid},
                     {"tid", int(e.lane)},
                     {"ts", e.start_us - t0},
                     {"dur", e.dur_us},
                     {"args", {{"op", e.op}, {"bytes", e.bytes}}}});
  }
  return {{"traceEvents", out}, {"displayTimeUnit", "ms"}};
}

nlohmann::json trace_events_json(const std::vector<TraceEvent>& events) {
  nlohmann::json a = nlohmann::json::array();
  for (const TraceEvent& e : events)
    a.push_back({e.name, e.op, int(e.lane), e.start_us, e.dur_us, e.bytes});
  return a;
}

std::vector<TraceEvent> trace_events_from_json(const nlohmann::json& j) {
  std::vector<TraceEvent> out;
  for (const auto& e : j)
    out.push_back({e[0].get<std::string>(), e[1].get<std::string>(),
                   TraceEvent::Lane(e[2].get<int>()), e[3].get<double>(), e[4].get<double>(),
                   e[5].get<int64_t>()});
  return out;
}

void write_trace(const std::string& path, const Trace& trace, const MeshComms* comms) {
  const std::vector<TraceEvent> mine = trace.events();
  std::vector<std::vector<TraceEvent>> per_rank{mine};
  if (comms) {
    comm::Communicator& w = comms->world();
    const std::string text = trace_events_json(mine).dump();
    std::vector<int64_t> sizes(size_t(w.size()));
    const int64_t size = int64_t(text.size());
    w.all_gather(&size, sizes.data(), 8);
    const int64_t block = *std::max_element(sizes.begin(), sizes.end());
    std::string padded = text;
    padded.resize(size_t(block));
    std::string all(size_t(block * w.size()), '\0');
    w.all_gather(padded.data(), all.data(), block);
    if (w.rank() != 0) return;
    per_rank.clear();
    for (int r = 0; r < w.size(); ++r)
      per_rank.push_back(trace_events_from_json(
          nlohmann::json::parse(all.substr(size_t(r * block), size_t(sizes[size_t(r)])))));
  }
  write_file_atomic(path, chrome_trace(per_rank).dump() + "\n");
}

}  // namespace loom::runtime
