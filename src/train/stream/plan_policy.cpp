// SPDX-License-Identifier: Apache-2.0
#include "train/stream/plan_policy.h"

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

#include "core/file_util.h"
#include "core/json.h"
#include "core/json_flags.h"
#include "train/train_checkpoint.h"

namespace ferry::train::stream {

Result<PlanPolicy> plan_policy_from_text(const std::string& text, const std::string& what,
                                         int layers, const std::string& nvme_dir) {
  FERRY_ASSIGN_OR_RETURN(const Json j, parse_json(text, what));
  PlanPolicy out;
  try {
    if (!j.contains("format") || j.at("format").get<std::string>() != "ferry-plan") {
      return corrupt("train: {} is not a ferry-plan document", what);
    }
    const int L = j.at("num_layers").get<int>();
    if (L != layers) {
      return invalid_argument("train: plan {} is for {} layers, the model has {}", what, L, layers);
    }
    out.batch_size = j.at("batch_size").get<int>();
    out.seq_len = j.at("seq_len").get<int>();
    const Json& bs = j.at("boundaries");
    if (!bs.is_array() || static_cast<int>(bs.size()) != L + 1) {
      return corrupt("train: plan {} has no home for each of its {} boundaries", what, L + 1);
    }
    for (int i = 0; i < L; ++i) {
      const Json& b = bs.at(static_cast<std::size_t>(i));
      if (b.at("boundary").get<int>() != i)
        return corrupt("train: plan {}: boundaries out of order", what);
      const std::string h = b.at("home").get<std::string>();
      if (h == "gpu") {
        out.policy.homes.push_back(Home::kDevice);
      } else if (h == "host") {
        out.policy.homes.push_back(Home::kHost);
      } else if (h == "nvme") {
        out.policy.homes.push_back(Home::kNvme);
      } else if (h == "recompute") {
        out.policy.homes.push_back(Home::kRecompute);
      } else {
        return corrupt("train: plan {}: boundary {} has home \"{}\"", what, i, h);
      }
    }
    // Optional: the layers whose internals the plan keeps for their backward (issue #7), L
    // booleans (true/false or 0/1); absent = none.
    if (j.contains("keep_internals")) {
      FERRY_ASSIGN_OR_RETURN(std::vector<bool> keep,
                             flag_array(j.at("keep_internals"), static_cast<std::size_t>(L),
                                        fmt::format("train: plan {}: keep_internals", what)));
      if (std::count(keep.begin(), keep.end(), true) > 0) out.policy.keep = std::move(keep);
    }
    // Optional: decoder layers 0..K-1 GPU-resident (ferry train --resident-layers K); absent in
    // documents written before the planner chose them: 0.
    out.resident_layers = j.value("resident_layers", 0);
    if (out.resident_layers < 0 || out.resident_layers > L) {
      return corrupt("train: plan {}: resident_layers {} of {} layers", what, out.resident_layers,
                     L);
    }
    if (j.contains("spans")) {
      for (const Json& s : j.at("spans")) {
        if (s.value("keep_weights", false)) ++out.keep_weight_spans;
      }
    }
    if (j.contains("predicted")) {
      const Json& pr = j.at("predicted");
      out.window_compute_ms = pr.at("window_compute_ms").get<std::vector<double>>();
      out.window_exposed_ms = pr.at("window_exposed_ms").get<std::vector<double>>();
      out.predicted_step_ms = pr.at("step_ms").get<double>();
      const auto windows = static_cast<std::size_t>(2 * L + 1);
      if (out.window_compute_ms.size() != windows || out.window_exposed_ms.size() != windows) {
        return corrupt("train: plan {}: predicted windows are not 2L+1 = {}", what, windows);
      }
    }
    out.policy.name = "plan:" + j.value("policy", std::string("?"));
    out.fingerprint = plan_fingerprint(j);
  } catch (const std::exception& e) {
    return corrupt("train: plan {}: {}", what, e.what());
  }
  out.policy.nvme_dir = nvme_dir;
  FERRY_TRY(validate(out.policy));
  return out;
}

Result<int> read_plan_resident_layers(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  try {
    const Json j = Json::parse(text);
    const int k = j.value("resident_layers", 0);
    if (k < 0) return corrupt("train: plan {}: resident_layers {} < 0", path, k);
    return k;
  } catch (const std::exception& e) {
    return corrupt("train: plan {}: {}", path, e.what());
  }
}

std::string plan_fingerprint(const Json& plan_doc) {
  const std::string dump = plan_doc.dump();
  return fmt::format("{:016x}", fnv1a64(dump.data(), dump.size()));
}

Result<PlanPolicy> read_plan_policy(const std::string& path, int layers,
                                    const std::string& nvme_dir) {
  FERRY_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  return plan_policy_from_text(text, path, layers, nvme_dir);
}

}  // namespace ferry::train::stream
