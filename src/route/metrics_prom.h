// SPDX-License-Identifier: Apache-2.0
// Prometheus text exposition (format 0.0.4) for the route edge agent and cloud server: counters,
// gauges and fixed-bucket histograms kept in a registry that renders them as /metrics text.
// Metrics are created once at startup (create_* is not for the request path) and then updated
// lock-free (counters/gauges: atomics) or under a per-histogram mutex. Names follow Prometheus
// rules ([a-zA-Z_:][a-zA-Z0-9_:]*); a bad name or a duplicate series is a bug (FERRY_CHECK).
// Thread-safety: create_* from one thread before serving; inc/set/observe/render concurrently.
// Covered by tests/unit/route/server_test.cpp (the /metrics checker parses the output).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ferry::route {

class PromCounter {
 public:
  void inc(double v = 1) { v_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

class PromGauge {
 public:
  void set(double v) { v_.store(v, std::memory_order_relaxed); }
  void add(double v) { v_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> v_{0};
};

class PromHistogram {
 public:
  explicit PromHistogram(std::vector<double> upper_bounds);  // ascending, finite
  void observe(double v);
  struct Snapshot {
    std::vector<double> bounds;             // [K]
    std::vector<std::uint64_t> cumulative;  // [K + 1], last = +Inf = count
    double sum = 0;
  };
  Snapshot snapshot() const;

 private:
  std::vector<double> bounds_;
  std::vector<std::uint64_t> counts_;  // [K + 1], per bucket (not cumulative)
  double sum_ = 0;
  mutable std::mutex mu_;
};

class PromRegistry {
 public:
  // `labels` is a rendered label set without braces, e.g. `outcome="ok"` (may be empty). Series
  // with the same name share one HELP/TYPE block and must be created with the same help text.
  PromCounter& counter(const std::string& name, const std::string& help,
                       const std::string& labels = "");
  PromGauge& gauge(const std::string& name, const std::string& help,
                   const std::string& labels = "");
  PromHistogram& histogram(const std::string& name, const std::string& help,
                           std::vector<double> upper_bounds, const std::string& labels = "");
  std::string render() const;

 private:
  enum class Kind : std::uint8_t { kCounter, kGauge, kHistogram };
  struct Entry {
    std::string name, help, labels;
    Kind kind;
    std::unique_ptr<PromCounter> counter;
    std::unique_ptr<PromGauge> gauge;
    std::unique_ptr<PromHistogram> histogram;
  };
  Entry& add(const std::string& name, const std::string& help, const std::string& labels,
             Kind kind);
  std::deque<Entry> entries_;
  mutable std::mutex mu_;
};

// Exponential bucket bounds: start, start·factor, ... (count bounds).
std::vector<double> exponential_buckets(double start, double factor, int count);

}  // namespace ferry::route
