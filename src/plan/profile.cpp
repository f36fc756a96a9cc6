// SPDX-License-Identifier: Apache-2.0
#include "plan/profile.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

#include "core/file_util.h"
#include "core/log.h"
#include "plan/cost_model.h"

namespace ferry::plan {

std::string geometry_key(const model::ModelConfig& c) {
  return fmt::format("{}-L{}-C{}-F{}-H{}-KV{}-D{}-V{}-E{}", c.model_type, c.num_hidden_layers,
                     c.hidden_size, c.is_moe() ? c.moe_intermediate_size : c.intermediate_size,
                     c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.vocab_size,
                     c.num_experts);
}

std::string default_profile_path(const std::string& machine, const std::string& geometry) {
  std::string dir;
  if (const char* d = std::getenv("FERRY_CACHE_DIR"); d != nullptr && *d != '\0') {
    dir = d;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    dir = std::string(x) + "/ferry";
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') {
    dir = std::string(h) + "/.cache/ferry";
  } else {
    dir = ".ferry-cache";
  }
  return fmt::format("{}/plan/{}__{}.json", dir, machine, geometry);
}

Json to_json(const Profile& p) {
  Json layers = Json::array();
  for (const LayerTimes& l : p.layers) {
    layers.push_back({{"fwd_ms", l.fwd_ms},
                      {"bwd_ms", l.bwd_ms},
                      {"rec_ms", l.rec_ms},
                      {"reforward_ms", l.reforward_ms}});
  }
  return {{"format", "ferry-plan-profile"},
          {"version", 1},
          {"machine", p.machine},
          {"geometry", p.geometry},
          {"batch_size", p.batch_size},
          {"seq_len", p.seq_len},
          {"measured_by", p.measured_by},
          {"link",
           {{"h2d_gbps", p.link.h2d_gbps},
            {"d2h_gbps", p.link.d2h_gbps},
            {"duplex_gbps", p.link.duplex_gbps},
            {"duplex_loaded_gbps", p.link.duplex_loaded_gbps},
            {"nvme_read_gbps", p.link.nvme_read_gbps},
            {"nvme_write_gbps", p.link.nvme_write_gbps}}},
          {"layers", layers},
          {"loss_ms", p.loss_ms},
          {"cpu_optimizer_ms", p.cpu_optimizer_ms},
          {"optimizer_layer_ms", p.optimizer_layer_ms},
          {"host_home_ms_per_gb", p.host_home_ms_per_gb},
          {"host_home_measured_by", p.host_home_measured_by},
          {"resident_saved_ms", p.resident_saved_ms},
          {"resident_saved_measured_by", p.resident_saved_measured_by},
          {"device_update_ms_per_layer", p.device_update_ms_per_layer},
          {"device_update_h2d_gb_per_layer", p.device_update_h2d_gb_per_layer},
          {"device_update_measured_by", p.device_update_measured_by}};
}

std::string device_update_text(const Profile& p) {
  if (p.device_update_measured_by.empty() && p.device_update_ms_per_layer == 0 &&
      p.device_update_h2d_gb_per_layer == 0) {
    return "not measured (the device tail's time and bytes per layer are derived from the host "
           "state share over the H2D rate)";
  }
  return fmt::format("{:.2f} ms and {:.3f} GB H2D per layer ({})", p.device_update_ms_per_layer,
                     p.device_update_h2d_gb_per_layer, p.device_update_measured_by);
}

std::string resident_saved_text(const Profile& p) {
  if (p.resident_saved_measured_by.empty() && p.resident_saved_ms == 0) {
    return "0 ms/layer (not measured: the profile has no run with resident layers, so a resident "
           "layer saves only its modelled transfers and CPU update)";
  }
  return fmt::format("{:.3f} ms/layer ({})", p.resident_saved_ms, p.resident_saved_measured_by);
}

std::string host_home_text(const Profile& p) {
  if (p.host_home_measured_by.empty() && p.host_home_ms_per_gb == 0) {
    return "0 ms/GB (not measured: the profile has no host-home term, so off-gpu boundaries are "
           "priced free when their transfers hide)";
  }
  return fmt::format("{:.3f} ms/GB ({})", p.host_home_ms_per_gb, p.host_home_measured_by);
}

Result<Profile> profile_from_json(const Json& j, const model::ModelConfig& cfg) {
  try {
    if (j.at("format").get<std::string>() != "ferry-plan-profile" ||
        j.at("version").get<int>() != 1) {
      return corrupt("plan: not a version-1 ferry-plan-profile document");
    }
    Profile p;
    p.machine = j.at("machine").get<std::string>();
    p.geometry = j.at("geometry").get<std::string>();
    p.batch_size = j.at("batch_size").get<int>();
    p.seq_len = j.at("seq_len").get<int>();
    p.measured_by = j.at("measured_by").get<std::string>();
    const Json& r = j.at("link");
    p.link.h2d_gbps = r.at("h2d_gbps").get<double>();
    p.link.d2h_gbps = r.at("d2h_gbps").get<double>();
    p.link.duplex_gbps = r.at("duplex_gbps").get<double>();
    p.link.duplex_loaded_gbps = r.at("duplex_loaded_gbps").get<double>();
    p.link.nvme_read_gbps = r.at("nvme_read_gbps").get<double>();
    p.link.nvme_write_gbps = r.at("nvme_write_gbps").get<double>();
    if (p.batch_size < 1 || p.seq_len < 1) return corrupt("plan: profile batch/seq < 1");
    for (const Json& l : j.at("layers")) {
      LayerTimes t{.fwd_ms = l.at("fwd_ms").get<double>(),
                   .bwd_ms = l.at("bwd_ms").get<double>(),
                   .rec_ms = l.at("rec_ms").get<double>()};
      const int layer = static_cast<int>(p.layers.size());
      if (l.contains("reforward_ms")) {
        t.reforward_ms = l.at("reforward_ms").get<double>();
      } else {
        // Written before the re-forward became internals-only: the model's share of rec_ms.
        if (layer >= cfg.num_hidden_layers) {
          return invalid_argument("plan: profile has more layers than the model's {}",
                                  cfg.num_hidden_layers);
        }
        t.reforward_ms = t.rec_ms * reforward_flop_share(cfg, layer, p.seq_len);
      }
      p.layers.push_back(t);
    }
    p.loss_ms = j.at("loss_ms").get<double>();
    p.cpu_optimizer_ms = j.at("cpu_optimizer_ms").get<double>();
    p.optimizer_layer_ms = j.value("optimizer_layer_ms", std::vector<double>{});
    if (!p.optimizer_layer_ms.empty() && p.optimizer_layer_ms.size() != p.layers.size()) {
      return corrupt("plan: profile has {} per-layer optimizer times for {} layers",
                     p.optimizer_layer_ms.size(), p.layers.size());
    }
    // Absent in profiles written before the host-home term: 0, i.e. not measured.
    p.host_home_ms_per_gb = j.value("host_home_ms_per_gb", 0.0);
    p.host_home_measured_by = j.value("host_home_measured_by", std::string{});
    if (!std::isfinite(p.host_home_ms_per_gb) || p.host_home_ms_per_gb < 0) {
      return corrupt("plan: profile host_home_ms_per_gb {} is not a cost >= 0",
                     p.host_home_ms_per_gb);
    }
    // Absent in profiles written before the resident-saving term: 0, i.e. not measured.
    p.resident_saved_ms = j.value("resident_saved_ms", 0.0);
    p.resident_saved_measured_by = j.value("resident_saved_measured_by", std::string{});
    if (!std::isfinite(p.resident_saved_ms) || p.resident_saved_ms < 0) {
      return corrupt("plan: profile resident_saved_ms {} is not a saving >= 0",
                     p.resident_saved_ms);
    }
    // Absent in profiles written before the tail was carried: 0, i.e. derived.
    p.device_update_ms_per_layer = j.value("device_update_ms_per_layer", 0.0);
    p.device_update_h2d_gb_per_layer = j.value("device_update_h2d_gb_per_layer", 0.0);
    p.device_update_measured_by = j.value("device_update_measured_by", std::string{});
    for (double v : {p.device_update_ms_per_layer, p.device_update_h2d_gb_per_layer}) {
      if (!std::isfinite(v) || v < 0) {
        return corrupt("plan: profile device_update time or bytes {} is not >= 0", v);
      }
    }
    return p;
  } catch (const Json::exception& e) {
    return corrupt("plan: profile json: {}", e.what());
  }
}

Result<Profile> read_profile(const std::string& path, const model::ModelConfig& cfg) {
  FERRY_ASSIGN_OR_RETURN(std::string text, read_file(path));
  FERRY_ASSIGN_OR_RETURN(Json j, parse_json(text, path));
  Result<Profile> p = profile_from_json(j, cfg);
  if (!p.ok()) return p.status().with_context(path);
  // "<model_type>-L..-C..-...": the shapes after the first "-L".
  const auto shapes = [](const std::string& key) {
    const std::size_t at = key.find("-L");
    return at == std::string::npos ? key : key.substr(at);
  };
  const std::string want = geometry_key(cfg);
  if (shapes(p->geometry) != shapes(want)) {
    return invalid_argument(
        "plan: profile {} was measured on {}, this plan is for {}: its times are another "
        "model's (measure this one: ferry bench train + ferry plan --from-bench)",
        path, p->geometry, want);
  }
  if (p->geometry != want) {
    log::get("plan")->warn(
        "profile {} was measured on {}, this plan is for {}: the same shapes, another "
        "architecture",
        path, p->geometry, want);
  }
  return p;
}

Status write_profile(const std::string& path, const Profile& p) {
  return write_file_atomic(path, to_json(p).dump(1) + "\n");
}

Status apply_profile(const Profile& prof, PlanProblem& p) {
  if (static_cast<int>(prof.layers.size()) != p.num_layers) {
    return invalid_argument("plan: profile has {} layers, model has {}", prof.layers.size(),
                            p.num_layers);
  }
  if (prof.seq_len != p.seq_len) {
    return invalid_argument("plan: profile measured at seq {}, planning for seq {}", prof.seq_len,
                            p.seq_len);
  }
  const double scale = static_cast<double>(p.batch_size) / prof.batch_size;
  for (int j = 0; j < p.num_layers; ++j) {
    p.layers[j].fwd_ms = prof.layers[j].fwd_ms * scale;
    p.layers[j].bwd_ms = prof.layers[j].bwd_ms * scale;
    p.layers[j].rec_ms = prof.layers[j].rec_ms * scale;
    // Keeping the internals saves the backward's internals-only re-forward (at most the measured
    // backward, which contains it), not a full forward. internals_gb stays the geometry's bytes.
    p.layers[j].keep_saved_ms = std::min(prof.layers[j].reforward_ms * scale, p.layers[j].bwd_ms);
  }
  p.loss_ms = prof.loss_ms * scale;
  p.cpu_optimizer_ms = prof.cpu_optimizer_ms;
  if (prof.optimizer_layer_ms.size() == prof.layers.size()) {
    for (int j = 0; j < p.num_layers; ++j) p.layers[j].optimizer_ms = prof.optimizer_layer_ms[j];
  }
  p.link = prof.link;
  p.host_home_ms_per_gb = prof.host_home_ms_per_gb;  // per GB: the same at every batch
  p.resident_saved_ms = prof.resident_saved_ms;      // per layer and step: likewise
  // The device tail per layer, as measured (0: derived): per unit, not scaled with the batch.
  p.device_update_ms_per_layer = prof.device_update_ms_per_layer;
  p.device_update_h2d_gb_per_layer = prof.device_update_h2d_gb_per_layer;
  p.source = "profile:" + prof.machine + ":" + prof.geometry;
  return validate(p);
}

}  // namespace ferry::plan
