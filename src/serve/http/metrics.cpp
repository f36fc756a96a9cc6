// SPDX-License-Identifier: Apache-2.0
#include "serve/http/metrics.h"

#include <algorithm>
#include <cstdio>

namespace ferry::serve::http {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void head(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void series(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += name;
  if (!labels.empty()) out += "{" + labels + "}";
  out += " " + num(v) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), v);
  std::lock_guard lk(mu_);
  ++counts_[static_cast<std::size_t>(it - bounds_.begin())];
  sum_ += v;
}

void Histogram::render(const std::string& name, std::string& out) const {
  std::lock_guard lk(mu_);
  std::uint64_t cum = 0;
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    series(out, name + "_bucket", "le=\"" + num(bounds_[i]) + "\"", double(cum));
  }
  cum += counts_.back();
  series(out, name + "_bucket", "le=\"+Inf\"", double(cum));
  series(out, name + "_sum", "", sum_);
  series(out, name + "_count", "", double(cum));
}

ServerMetrics::ServerMetrics()
    : ttft_s({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      inter_token_s({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}) {}

std::string ServerMetrics::render() const {
  std::string o;
  const std::string req = "ferry_serve_requests_total";
  head(o, req, "counter", "HTTP generation requests by outcome");
  series(o, req, "outcome=\"ok\"", double(requests_ok.load()));
  series(o, req, "outcome=\"cancelled\"", double(requests_cancelled.load()));
  series(o, req, "outcome=\"client_error\"", double(requests_client_error.load()));
  series(o, req, "outcome=\"server_error\"", double(requests_server_error.load()));
  const std::string fin = "ferry_serve_engine_finished_total";
  head(o, fin, "counter", "requests the engine finished, by finish reason");
  series(o, fin, "reason=\"length\"", double(finish_length.load()));
  series(o, fin, "reason=\"stop\"", double(finish_stop.load()));
  series(o, fin, "reason=\"cancelled\"", double(finish_cancelled.load()));
  head(o, "ferry_serve_generated_tokens_total", "counter", "tokens generated");
  series(o, "ferry_serve_generated_tokens_total", "", double(generated_tokens.load()));
  head(o, "ferry_serve_engine_steps_total", "counter", "engine steps");
  series(o, "ferry_serve_engine_steps_total", "", double(engine_steps.load()));
  head(o, "ferry_serve_requests_in_flight", "gauge", "requests submitted and not finished");
  series(o, "ferry_serve_requests_in_flight", "", in_flight.load());
  head(o, "ferry_serve_requests_awaiting_first_token", "gauge",
       "requests waiting for admission or in prefill (no token yet)");
  series(o, "ferry_serve_requests_awaiting_first_token", "", awaiting_first.load());
  head(o, "ferry_serve_kv_blocks_used", "gauge", "KV cache blocks in use");
  series(o, "ferry_serve_kv_blocks_used", "", kv_blocks_used.load());
  head(o, "ferry_serve_kv_blocks_total", "gauge", "KV cache blocks in the pool");
  series(o, "ferry_serve_kv_blocks_total", "", kv_blocks_total.load());
  head(o, "ferry_serve_kv_blocks_cached", "gauge",
       "KV blocks kept by the prefix cache, unreferenced (evictable)");
  series(o, "ferry_serve_kv_blocks_cached", "", kv_blocks_cached.load());
  head(o, "ferry_serve_prefix_cache_query_tokens_total", "counter",
       "tokens looked up in the prefix cache at admission");
  series(o, "ferry_serve_prefix_cache_query_tokens_total", "", double(prefix_query_tokens.load()));
  head(o, "ferry_serve_prefix_cache_hit_tokens_total", "counter",
       "tokens found in the prefix cache at admission (not computed again)");
  series(o, "ferry_serve_prefix_cache_hit_tokens_total", "", double(prefix_hit_tokens.load()));
  {
    const double q = double(prefix_query_tokens.load());
    head(o, "ferry_serve_prefix_cache_hit_rate", "gauge",
         "prefix cache hit tokens / query tokens since start");
    series(o, "ferry_serve_prefix_cache_hit_rate", "",
           q > 0 ? double(prefix_hit_tokens.load()) / q : 0.0);
  }
  head(o, "ferry_serve_preemptions_total", "counter",
       "running requests preempted for KV blocks (--kv-admission preempt)");
  series(o, "ferry_serve_preemptions_total", "", double(preemptions.load()));
  head(o, "ferry_serve_recompute_tokens_total", "counter",
       "tokens computed again for preempted requests on re-admission");
  series(o, "ferry_serve_recompute_tokens_total", "", double(recompute_tokens.load()));
  head(o, "ferry_serve_pager_hits_total", "counter", "expert pager hits");
  series(o, "ferry_serve_pager_hits_total", "", double(pager_hits.load()));
  head(o, "ferry_serve_pager_misses_total", "counter", "expert pager misses");
  series(o, "ferry_serve_pager_misses_total", "", double(pager_misses.load()));
  head(o, "ferry_serve_pager_bytes_copied_total", "counter", "bytes the expert pager copied");
  series(o, "ferry_serve_pager_bytes_copied_total", "", double(pager_bytes_copied.load()));
  head(o, "ferry_serve_expert_misses_on_host_total", "counter",
       "paged misses computed from host memory instead of copied, by reason");
  series(o, "ferry_serve_expert_misses_on_host_total", "reason=\"cost_model\"",
         double(host_computed_misses.load()));
  series(o, "ferry_serve_expert_misses_on_host_total", "reason=\"bypass\"",
         double(bypassed_misses.load()));
  head(o, "ferry_serve_time_to_first_token_seconds", "histogram", "submit to first token");
  ttft_s.render("ferry_serve_time_to_first_token_seconds", o);
  head(o, "ferry_serve_inter_token_seconds", "histogram", "time between a request's tokens");
  inter_token_s.render("ferry_serve_inter_token_seconds", o);
  return o;
}

}  // namespace ferry::serve::http
