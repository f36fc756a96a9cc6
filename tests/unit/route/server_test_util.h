// SPDX-License-Identifier: Apache-2.0
// Helpers for the route server/agent tests: a small synthetic record set and a Prometheus text
// checker (metric names declared by # TYPE before their samples, values parse, histogram buckets
// cumulative and ending in +Inf == _count). The checker has its own negative tests.
#pragma once

#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "route/synthetic.h"

namespace ferry::route::testing {

inline RecordSet small_records(int frames = 60, std::uint64_t seed = 3) {
  SyntheticOptions so;
  so.frames = frames;
  so.seed = seed;
  return make_synthetic_records(so);
}

// Returns "" when `text` is valid Prometheus text exposition, else the first problem found.
// `values` receives every sample (series text -> value).
inline std::string check_prometheus(const std::string& text,
                                    std::map<std::string, double>* values = nullptr) {
  static const std::regex kSample(
      R"re(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*)?\})? (\S+)$)re");
  static const std::regex kType(
      R"re(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram)$)re");
  static const std::regex kLe(R"re(,?le="[^"]*")re");
  std::map<std::string, std::string> types;
  std::map<std::string, double> last_bucket;  // series without le -> last cumulative count
  std::istringstream in(text);
  std::string line;
  int n = 0;
  if (text.empty() || text.back() != '\n') return "text must end with a newline";
  while (std::getline(in, line)) {
    ++n;
    std::smatch m;
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (line.rfind("# TYPE", 0) == 0) {
      if (!std::regex_match(line, m, kType)) return "line " + std::to_string(n) + ": bad TYPE";
      if (types.count(m[1])) return "line " + std::to_string(n) + ": TYPE declared twice";
      types[m[1]] = m[2];
      continue;
    }
    if (!std::regex_match(line, m, kSample)) return "line " + std::to_string(n) + ": bad sample";
    std::string name = m[1], base = name;
    const std::string labels = m[3];
    for (const char* suf : {"_bucket", "_sum", "_count"}) {
      const std::string s = suf;
      if (!types.count(name) && name.size() > s.size() &&
          name.compare(name.size() - s.size(), s.size(), s) == 0) {
        base = name.substr(0, name.size() - s.size());
      }
    }
    if (!types.count(base)) return "line " + std::to_string(n) + ": no TYPE for " + name;
    if (base != name && types[base] != "histogram")
      return "line " + std::to_string(n) + ": suffix on non-histogram " + name;
    const std::string v = m[5];
    char* end = nullptr;
    double val = std::strtod(v.c_str(), &end);
    if (v == "+Inf")
      val = HUGE_VAL;
    else if (*end != '\0')
      return "line " + std::to_string(n) + ": bad value " + v;
    if (values) (*values)[line.substr(0, line.size() - v.size() - 1)] = val;
    const std::string key = base + "{" + std::regex_replace(labels, kLe, "") + "}";
    if (name == base + "_bucket") {
      std::smatch le;
      if (!std::regex_search(labels, le, kLe)) return "line " + std::to_string(n) + ": no le";
      if (last_bucket.count(key) && val < last_bucket[key])
        return "line " + std::to_string(n) + ": buckets not cumulative";
      last_bucket[key] = val;
    } else if (name == base + "_count" && types[base] == "histogram") {
      if (!last_bucket.count(key) || last_bucket[key] != val)
        return "line " + std::to_string(n) + ": +Inf bucket != _count";
    }
  }
  return "";
}

}  // namespace ferry::route::testing
