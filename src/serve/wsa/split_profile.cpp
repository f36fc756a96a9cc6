// SPDX-License-Identifier: Apache-2.0
#include "serve/wsa/split_profile.h"

#include <cmath>
#include <fstream>
#include <sstream>

namespace ferry::serve::wsa {
namespace {

using Json = nlohmann::json;

constexpr const char* kKind = "ferry.wsa.split_profile";
constexpr int kVersion = 1;

bool all_finite(const std::vector<double>& v) {
  for (double x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

}  // namespace

Json split_problem_to_json(const SplitProblem& p) {
  // nlohmann writes doubles with round-trip precision (shortest representation that parses back
  // to the same bits), so from_json(to_json(p)) == p.
  Json j = {{"budget_bytes", p.budget_bytes},
            {"expert_bytes", p.expert_bytes},
            {"kv_block_bytes", p.kv_block_bytes},
            {"min_slots", p.min_slots},
            {"kv_floor_blocks", p.kv_floor_blocks},
            {"miss_cost_s", p.miss_cost_s},
            {"kv_block_cost_s", p.kv_block_cost_s},
            {"prefix_block_cost_s", p.prefix_block_cost_s},
            {"curve_steps", p.curve_steps},
            {"expert_misses", p.expert_misses},
            {"kv_short", p.kv_short},
            {"kv_prefix_misses", p.kv_prefix_misses}};
  // The cap-dependent block price (split_allocator.h allocate_priced_by_caps), when recorded;
  // profiles without it load with it empty.
  if (!p.recompute_misses.empty()) {
    j["recompute_misses"] = p.recompute_misses;
    j["prefix_block_base_s"] = p.prefix_block_base_s;
    j["prefix_misses_seen"] = p.prefix_misses_seen;
  }
  return j;
}

Result<SplitProblem> split_problem_from_json(const Json& j) {
  // nlohmann throws on a missing key or a wrong type (a non-finite number is written as null);
  // src/ lets no exception escape.
  SplitProblem p;
  try {
    p.budget_bytes = j.at("budget_bytes").get<std::size_t>();
    p.expert_bytes = j.at("expert_bytes").get<std::size_t>();
    p.kv_block_bytes = j.at("kv_block_bytes").get<std::size_t>();
    p.min_slots = j.at("min_slots").get<int>();
    p.kv_floor_blocks = j.at("kv_floor_blocks").get<int>();
    p.miss_cost_s = j.at("miss_cost_s").get<double>();
    p.kv_block_cost_s = j.at("kv_block_cost_s").get<double>();
    p.prefix_block_cost_s = j.at("prefix_block_cost_s").get<double>();
    p.curve_steps = j.at("curve_steps").get<double>();
    p.expert_misses = j.at("expert_misses").get<std::vector<std::vector<double>>>();
    p.kv_short = j.at("kv_short").get<std::vector<double>>();
    p.kv_prefix_misses = j.at("kv_prefix_misses").get<std::vector<double>>();
    if (j.contains("recompute_misses")) {
      p.recompute_misses = j.at("recompute_misses").get<std::vector<std::vector<double>>>();
      p.prefix_block_base_s = j.at("prefix_block_base_s").get<double>();
      p.prefix_misses_seen = j.at("prefix_misses_seen").get<double>();
    }
  } catch (const Json::exception& e) {
    return corrupt("wsa: split profile json: {}", e.what());
  }
  if (p.expert_misses.empty() || p.kv_short.empty()) {
    return invalid_argument("wsa: split profile has no expert or kv curve");
  }
  if (!p.recompute_misses.empty() && p.recompute_misses.size() != p.expert_misses.size()) {
    return invalid_argument("wsa: split profile has {} recompute curves for {} layers",
                            p.recompute_misses.size(), p.expert_misses.size());
  }
  for (const auto& m : p.recompute_misses) {
    if (m.size() != p.expert_misses.front().size()) {
      return invalid_argument("wsa: split profile's recompute curve has {} points, not {}",
                              m.size(), p.expert_misses.front().size());
    }
  }
  for (const auto& m : p.expert_misses) {
    if (m.size() != p.expert_misses.front().size()) {
      return invalid_argument("wsa: split profile's expert curves differ in length ({} vs {})",
                              m.size(), p.expert_misses.front().size());
    }
  }
  return p;
}

Status save_split_profile(const std::string& path, const SplitProfile& profile) {
  const SplitProblem& p = profile.problem;
  bool finite = all_finite(p.kv_short) && all_finite(p.kv_prefix_misses) &&
                std::isfinite(p.miss_cost_s) && std::isfinite(p.kv_block_cost_s) &&
                std::isfinite(p.prefix_block_cost_s) && std::isfinite(p.curve_steps);
  for (const auto& m : p.expert_misses) finite = finite && all_finite(m);
  for (const auto& m : p.recompute_misses) finite = finite && all_finite(m);
  finite = finite && std::isfinite(p.prefix_block_base_s) && std::isfinite(p.prefix_misses_seen);
  if (!finite) return invalid_argument("wsa: split profile for {} has a non-finite value", path);
  const Json j = {{"kind", kKind},
                  {"version", kVersion},
                  {"meta", profile.meta},
                  {"problem", split_problem_to_json(p)}};
  std::ofstream f(path);
  if (!f) return io_error("wsa: cannot write split profile {}", path);
  f << j.dump() << "\n";
  f.close();
  if (!f) return io_error("wsa: writing split profile {} failed", path);
  return ok_status();
}

Result<SplitProfile> load_split_profile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return not_found("wsa: cannot read split profile {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  const Json j = Json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return corrupt("wsa: {} is not a json object", path);
  try {  // value() throws when a key holds another type
    if (j.value("kind", std::string()) != kKind) {
      return corrupt("wsa: {} is not a split profile (kind {})", path,
                     j.contains("kind") ? j["kind"].dump() : std::string("missing"));
    }
    if (j.value("version", 0) != kVersion) {
      return corrupt("wsa: split profile {} has version {}, this build reads {}", path,
                     j.contains("version") ? j["version"].dump() : std::string("missing"),
                     kVersion);
    }
  } catch (const Json::exception& e) {
    return corrupt("wsa: split profile {}: {}", path, e.what());
  }
  if (!j.contains("problem")) return corrupt("wsa: split profile {} has no problem", path);
  SplitProfile out;
  FERRY_ASSIGN_OR_RETURN(out.problem, split_problem_from_json(j["problem"]));
  if (j.contains("meta") && j["meta"].is_object()) out.meta = j["meta"];
  return out;
}

}  // namespace ferry::serve::wsa
