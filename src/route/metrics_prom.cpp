// SPDX-License-Identifier: Apache-2.0
// Prometheus registry and text rendering (see metrics_prom.h).
#include "route/metrics_prom.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/check.h"

namespace ferry::route {
namespace {

bool valid_name(const std::string& n) {
  if (n.empty()) return false;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

std::string fmt_value(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  return fmt::format("{}", v);
}

std::string series(const std::string& name, const std::string& labels, const std::string& extra) {
  std::string l = labels;
  if (!extra.empty()) l += (l.empty() ? "" : ",") + extra;
  return l.empty() ? name : name + "{" + l + "}";
}

}  // namespace

PromHistogram::PromHistogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {
  FERRY_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()), "prom: histogram bounds unsorted");
}

void PromHistogram::observe(double v) {
  const auto k = static_cast<std::size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) -
                                          bounds_.begin());  // le semantics
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[k];
  sum_ += v;
}

PromHistogram::Snapshot PromHistogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  std::lock_guard<std::mutex> lock(mu_);
  std::uint64_t acc = 0;
  for (std::uint64_t c : counts_) s.cumulative.push_back(acc += c);
  s.sum = sum_;
  return s;
}

PromRegistry::Entry& PromRegistry::add(const std::string& name, const std::string& help,
                                       const std::string& labels, Kind kind) {
  FERRY_CHECK(valid_name(name), "prom: invalid metric name '{}'", name);
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& e : entries_) {
    FERRY_CHECK(!(e.name == name && e.labels == labels), "prom: duplicate series {}{{{}}}", name,
                labels);
    FERRY_CHECK(e.name != name || e.kind == kind, "prom: metric {} registered with two types",
                name);
  }
  entries_.push_back(Entry{name, help, labels, kind, nullptr, nullptr, nullptr});
  return entries_.back();
}

PromCounter& PromRegistry::counter(const std::string& name, const std::string& help,
                                   const std::string& labels) {
  Entry& e = add(name, help, labels, Kind::kCounter);
  e.counter = std::make_unique<PromCounter>();
  return *e.counter;
}

PromGauge& PromRegistry::gauge(const std::string& name, const std::string& help,
                               const std::string& labels) {
  Entry& e = add(name, help, labels, Kind::kGauge);
  e.gauge = std::make_unique<PromGauge>();
  return *e.gauge;
}

PromHistogram& PromRegistry::histogram(const std::string& name, const std::string& help,
                                       std::vector<double> upper_bounds,
                                       const std::string& labels) {
  Entry& e = add(name, help, labels, Kind::kHistogram);
  e.histogram = std::make_unique<PromHistogram>(std::move(upper_bounds));
  return *e.histogram;
}

std::string PromRegistry::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  std::vector<std::string> done;
  for (const Entry& head : entries_) {
    if (std::find(done.begin(), done.end(), head.name) != done.end()) continue;
    done.push_back(head.name);
    const char* type = head.kind == Kind::kCounter ? "counter"
                       : head.kind == Kind::kGauge ? "gauge"
                                                   : "histogram";
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", head.name, head.help, head.name, type);
    for (const Entry& e : entries_) {
      if (e.name != head.name) continue;
      if (e.kind == Kind::kCounter) {
        out += series(e.name, e.labels, "") + " " + fmt_value(e.counter->value()) + "\n";
      } else if (e.kind == Kind::kGauge) {
        out += series(e.name, e.labels, "") + " " + fmt_value(e.gauge->value()) + "\n";
      } else {
        const PromHistogram::Snapshot s = e.histogram->snapshot();
        for (std::size_t k = 0; k <= s.bounds.size(); ++k) {
          const std::string le =
              "le=\"" + (k < s.bounds.size() ? fmt_value(s.bounds[k]) : std::string("+Inf")) + "\"";
          out += series(e.name + "_bucket", e.labels, le) + " " + std::to_string(s.cumulative[k]) +
                 "\n";
        }
        out += series(e.name + "_sum", e.labels, "") + " " + fmt_value(s.sum) + "\n";
        out += series(e.name + "_count", e.labels, "") + " " + std::to_string(s.cumulative.back()) +
               "\n";
      }
    }
  }
  return out;
}

std::vector<double> exponential_buckets(double start, double factor, int count) {
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

}  // namespace ferry::route
