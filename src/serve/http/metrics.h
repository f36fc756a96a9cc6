// SPDX-License-Identifier: Apache-2.0
// The HTTP server's metrics and their Prometheus text rendering (format 0.0.4). A small registry
// of its own: serve must not depend on route (whose metrics_prom.h is the same idea).
//   counters / gauges: atomics, updated from any thread
//   histograms: fixed upper bounds, one mutex each
// Rendered names: ferry_serve_* (see docs/serve.md "HTTP server" for the list).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace ferry::serve::http {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // ascending, finite
  void observe(double v);
  // Appends `name_bucket{le=..}`, `name_sum`, `name_count` lines.
  void render(const std::string& name, std::string& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<std::uint64_t> counts_;  // [bounds + 1], per bucket
  double sum_ = 0;
  mutable std::mutex mu_;
};

struct ServerMetrics {
  ServerMetrics();
  // Requests by how they ended: ok (finished normally), cancelled (client went away or server
  // stopped), client_error (4xx), server_error (5xx).
  std::atomic<std::uint64_t> requests_ok{0}, requests_cancelled{0}, requests_client_error{0},
      requests_server_error{0};
  std::atomic<std::uint64_t> generated_tokens{0};
  // Engine finish reasons (length, stop_token, stop_string, cancelled), counted as the engine
  // reports them.
  std::atomic<std::uint64_t> finish_length{0}, finish_stop{0}, finish_cancelled{0};
  // Snapshots the engine thread takes after every step.
  std::atomic<int> in_flight{0};       // submitted, not finished
  std::atomic<int> awaiting_first{0};  // submitted, no token yet (waiting or in prefill)
  std::atomic<int> kv_blocks_used{0}, kv_blocks_total{0};
  // Prefix cache: cached (unreferenced, evictable) blocks; prompt tokens looked up at admission
  // and those found cached (the hit rate is their ratio).
  std::atomic<int> kv_blocks_cached{0};
  std::atomic<std::uint64_t> prefix_query_tokens{0}, prefix_hit_tokens{0};
  // KV admission by preemption (EngineConfig::kv_preempt): requests preempted for blocks and the
  // tokens recomputed for them on re-admission.
  std::atomic<std::uint64_t> preemptions{0}, recompute_tokens{0};
  std::atomic<std::uint64_t> pager_hits{0}, pager_misses{0}, pager_bytes_copied{0};
  // Paged misses computed from host memory (miss placement: cost model, bypass admission).
  std::atomic<std::uint64_t> host_computed_misses{0}, bypassed_misses{0};
  std::atomic<std::uint64_t> engine_steps{0};
  Histogram ttft_s;         // submit -> first token
  Histogram inter_token_s;  // between consecutive tokens of one request

  std::string render() const;
};

}  // namespace ferry::serve::http
