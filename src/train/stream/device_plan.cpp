// SPDX-License-Identifier: Apache-2.0
#include "train/stream/device_plan.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "mem/budget.h"

namespace ferry::train::stream {

bool bf16_weight_views_default() {
  static const bool on = [] {
    const char* v = std::getenv("FERRY_BF16_WEIGHT_VIEWS");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

bool bf16_weight_views(const ModelSizes& sizes, const kernels::Backend& backend,
                       model::GemmPrecision precision) {
  return sizes.bf16_weights && sizes.bf16_weight_views &&
         precision == model::GemmPrecision::kBf16 && backend.device() != Device::kCpu &&
         backend.supports(kernels::OpKind::kGemm, DType::kBF16);
}

Json device_plan_model(const model::ModelConfig& config) {
  return Json{{"model_type", config.model_type},
              {"layers", config.num_hidden_layers},
              {"hidden", config.hidden_size},
              {"intermediate", config.intermediate_size},
              {"heads", config.num_attention_heads},
              {"kv_heads", config.num_key_value_heads},
              {"head_dim", config.head_dim},
              {"vocab", config.vocab_size},
              {"tied", config.tie_word_embeddings},
              {"qk_norm", std::string(model::to_string(config.qk_norm))},
              {"qkv_bias", config.qkv_bias},
              {"o_bias", config.o_bias},
              {"experts", config.num_experts},
              {"expert_intermediate", config.moe_intermediate_size}};
}

std::string device_plan_model_mismatch(const Json& planned, const Json& run) {
  std::string out;
  for (const auto& [key, value] : run.items()) {
    // A field the plan does not record (an older document) is not a difference.
    if (!planned.is_object() || !planned.contains(key) || planned.at(key) == value) continue;
    out += fmt::format("{}{} {} (this run {})", out.empty() ? "" : ", ", key,
                       planned.at(key).dump(), value.dump());
  }
  return out;
}

Result<DevicePlan> plan_device(const model::DecoderGeometry& geo, const ModelSizes& sizes,
                               const ActivationPolicy& policy, int slots, std::int64_t tokens,
                               kernels::Backend& backend, model::GemmPrecision precision) {
  if (slots < 2) return invalid_argument("train: {} weight slots; the ring needs >= 2", slots);
  if (policy.layers() != geo.layers) {
    return invalid_argument("train: policy for {} layers, model has {}", policy.layers(),
                            geo.layers);
  }
  if (!policy.keep.empty() && policy.keep.size() != policy.homes.size()) {
    return invalid_argument("train: policy {} has {} keep flags for {} layers", policy.name,
                            policy.keep.size(), policy.homes.size());
  }
  DevicePlan d;
  const std::size_t f = sizeof(float);
  const std::size_t act = static_cast<std::size_t>(tokens) * geo.hidden * f;
  d.bf16_weight_views = bf16_weight_views(sizes, backend, precision);
  const std::size_t layer = static_cast<std::size_t>(sizes.max_layer_elements) * f;
  // A weight slot: the whole layer in f32, or with views its f32 part + a bf16 twin of the layer.
  const std::size_t slot_f32 =
      d.bf16_weight_views ? static_cast<std::size_t>(sizes.max_layer_f32_elements) * f : layer;
  const std::size_t layer16 =
      d.bf16_weight_views ? static_cast<std::size_t>(sizes.max_layer_elements) * 2 : 0;
  const std::size_t globals = static_cast<std::size_t>(sizes.globals_elements) * f;
  d.globals_w = d.plan.add("globals.weights", globals);
  d.globals_g = d.plan.add("globals.grads", globals);
  for (int s = 0; s < slots; ++s)
    d.slots.push_back(d.plan.add("slot." + std::to_string(s), slot_f32));
  for (int s = 0; s < slots; ++s) {
    d.slots16.push_back(d.plan.add("slot16." + std::to_string(s), layer16));
  }
  for (int g = 0; g < kGradSlots; ++g)
    d.grads.push_back(d.plan.add("grad." + std::to_string(g), layer));
  const std::size_t g16 = sizes.bf16_grads ? 2 : 0;  // bytes per element of the bf16 twins
  for (int g = 0; g < kGradSlots; ++g) {
    d.grad16.push_back(d.plan.add("grad16." + std::to_string(g),
                                  static_cast<std::size_t>(sizes.max_layer_elements) * g16));
  }
  d.boundary.resize(static_cast<std::size_t>(geo.layers));
  for (int i = 0; i < geo.layers; ++i) {
    if (policy.homes[i] == Home::kDevice) {
      d.boundary[i] = d.plan.add("boundary." + std::to_string(i), act);
    }
  }
  d.x_final = d.plan.add("x_final", act);
  // Transit buffer k holds the forward's boundaries i = k (mod 2) homed off the device (stored,
  // or recomputed: read by the next layer) and transit.1 also a backward fetch. Nothing else
  // writes them (the backward's re-forwards are internals-only: no output), so one no boundary
  // of the policy needs is empty.
  const bool offloaded = policy.count(Home::kHost) + policy.count(Home::kNvme) > 0;
  std::array<bool, 2> transit_used{false, offloaded};
  for (int i = 0; i < geo.layers; ++i) transit_used[i % 2] |= policy.homes[i] != Home::kDevice;
  d.transit.push_back(d.plan.add("transit.0", transit_used[0] ? act : 0));
  d.transit.push_back(d.plan.add("transit.1", transit_used[1] ? act : 0));
  d.fetch = d.plan.add("fetch", offloaded ? act : 0);
  for (int r = 0; r < policy.max_recomputed(); ++r) {
    d.recompute.push_back(d.plan.add("recompute." + std::to_string(r), act));
  }
  if (sizes.bf16_weights && backend.device() != Device::kCpu && !d.bf16_weight_views) {
    d.stage16_elements = std::max(sizes.max_layer_elements, sizes.globals_elements);
  }
  d.stage16 = d.plan.add("stage16", static_cast<std::size_t>(d.stage16_elements) * 2);
  d.optimizer_tail = d.plan.add("optimizer_tail", sizes.optimizer_tail_bytes);
  d.resident = d.plan.add("resident", sizes.resident_bytes);
  d.sumsq = d.plan.add("sumsq", static_cast<std::size_t>(sizes.params) * f);
  d.sumsq_ws = d.plan.add("sumsq.workspace", backend.workspace_bytes(kernels::SumSquaresArgs{}));
  const std::size_t batch_ints = backend.device() == Device::kCpu ? 0 : 4 * tokens + 1;
  d.batch = d.plan.add("batch", batch_ints * sizeof(std::int32_t));
  // The kept layers' workspaces are part of ModelCompute's arena (dedicated workspaces beside
  // the shared one), so compute_bytes grows by exactly kept_layer_bytes per kept layer.
  FERRY_ASSIGN_OR_RETURN(d.compute_bytes, model::ModelCompute::planned_bytes(
                                              geo, tokens, backend, 1, precision,
                                              model::AttnBwdWorkspace::kDefault, policy.keep));
  for (int l = 0; l < geo.layers; ++l) {
    if (!policy.kept(l)) continue;
    FERRY_ASSIGN_OR_RETURN(const std::size_t k, model::ModelCompute::kept_layer_bytes(
                                                    geo, l, tokens, backend, precision));
    d.kept_bytes += k;
  }
  return d;
}

Result<int> largest_batch(const model::DecoderGeometry& geo, const ModelSizes& sizes,
                          const ActivationPolicy& policy, int slots, std::int64_t seq_len,
                          std::size_t budget, kernels::Backend& backend,
                          model::GemmPrecision precision, int limit_batch) {
  auto fits = [&](int b) -> Result<bool> {
    FERRY_ASSIGN_OR_RETURN(const DevicePlan d,
                           plan_device(geo, sizes, policy, slots, b * seq_len, backend, precision));
    return d.total_bytes() <= budget;
  };
  FERRY_ASSIGN_OR_RETURN(const bool one, fits(1));
  if (!one) return 0;
  // Bytes grow with the batch: grow an upper bound, then bisect.
  int lo = 1, hi = 2;
  for (;;) {
    if (hi > limit_batch) {
      hi = limit_batch + 1;
      break;
    }
    FERRY_ASSIGN_OR_RETURN(const bool ok, fits(hi));
    if (!ok) break;
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    FERRY_ASSIGN_OR_RETURN(const bool ok, fits(mid));
    (ok ? lo : hi) = mid;
  }
  return lo;
}

Status check_budget(const model::DecoderGeometry& geo, const ModelSizes& sizes,
                    const ActivationPolicy& policy, int slots, int batch, std::int64_t seq_len,
                    std::size_t budget, kernels::Backend& backend, model::GemmPrecision precision) {
  FERRY_ASSIGN_OR_RETURN(const DevicePlan d, plan_device(geo, sizes, policy, slots, batch * seq_len,
                                                         backend, precision));
  if (d.total_bytes() <= budget) return {};
  FERRY_ASSIGN_OR_RETURN(const int best, largest_batch(geo, sizes, policy, slots, seq_len, budget,
                                                       backend, precision));
  // Kept layer internals (+keep:LIST, a plan's keep_internals) are often what does not fit: how
  // much of the reported bytes they are (`plan`'s), and the batch that fits without them.
  const auto keeps = [&](const DevicePlan& plan, int at_batch) -> Result<std::string> {
    if (policy.kept_count() == 0) return std::string();
    ActivationPolicy none = policy;
    none.keep.clear();
    FERRY_ASSIGN_OR_RETURN(const int without, largest_batch(geo, sizes, none, slots, seq_len,
                                                            budget, backend, precision, batch));
    return fmt::format("; the kept internals of {} layers ({}) take {} of it at batch {}; {}",
                       policy.kept_count(), keep_list(policy.keep),
                       mem::format_bytes(plan.kept_bytes), at_batch,
                       without == 0 ? std::string("without the keeps not even batch 1 fits")
                                    : fmt::format("without the keeps batch {} fits", without));
  };
  if (best == 0) {
    FERRY_ASSIGN_OR_RETURN(const DevicePlan one,
                           plan_device(geo, sizes, policy, slots, seq_len, backend, precision));
    FERRY_ASSIGN_OR_RETURN(const std::string k, keeps(one, 1));
    return resource_exhausted(
        "train: the device budget of {} does not fit even batch 1 (needs {}) under policy {} "
        "with {} weight slots{}; raise --device-budget-mib, lower --seq-len or --prefetch{}",
        mem::format_bytes(budget), mem::format_bytes(one.total_bytes()), policy.describe(), slots,
        k, k.empty() ? "" : ", or keep fewer layers");
  }
  FERRY_ASSIGN_OR_RETURN(const std::string k, keeps(d, batch));
  return resource_exhausted(
      "train: batch {} (x seq {}) needs {} of device tier under policy {} ({} weight slots; {} "
      "of it compute workspace), the budget is {}: the largest batch that fits is {}{}",
      batch, seq_len, mem::format_bytes(d.total_bytes()), policy.describe(), slots,
      mem::format_bytes(d.compute_bytes), mem::format_bytes(budget), best, k);
}

}  // namespace ferry::train::stream
