// SPDX-License-Identifier: Apache-2.0
#include "apps/ferry/serve_engine_setup.h"

#include <algorithm>
#include <filesystem>

#include "apps/ferry/cpu_expert_kernel_flag.h"
#include "train/builtin_model.h"

namespace ferry::app {

Result<ServingModel> load_serving_model(const std::string& model_dir) {
  ServingModel h;
  if (!model_dir.empty()) {
    FERRY_ASSIGN_OR_RETURN(h.loaded, model::load_model_f32(model_dir));
    const std::string tok = model_dir + "/tokenizer.json";
    if (std::filesystem::exists(tok)) {
      FERRY_ASSIGN_OR_RETURN(model::Tokenizer t, model::Tokenizer::from_file(tok));
      h.tokenizer.emplace(std::move(t));
    }
  } else {
    FERRY_ASSIGN_OR_RETURN(h.builtin, serve::make_builtin_moe({}, /*seed=*/0x5eed));
    FERRY_ASSIGN_OR_RETURN(model::Tokenizer t, model::Tokenizer::from_json_text(
                                                   train::builtin_tokenizer_json(), "builtin"));
    h.tokenizer.emplace(std::move(t));
  }
  return h;
}

Result<serve::EngineConfig> engine_config(const EngineFlags& f, const model::DecoderGeometry& geo,
                                          std::string_view command) {
  serve::EngineConfig ec;
  FERRY_ASSIGN_OR_RETURN(ec.pager.mode, serve::parse_expert_mode(f.mode));
  FERRY_ASSIGN_OR_RETURN(ec.pager.policy, serve::parse_eviction_policy(f.policy));
  ec.pager.slots_per_layer = f.expert_slots;
  if (!f.layer_slots.empty()) {
    const auto moe = static_cast<std::size_t>(
        std::count(geo.layer_is_moe.begin(), geo.layer_is_moe.end(), true));
    if (f.layer_slots.size() != moe) {
      return invalid_argument("{}: --layer-slots has {} entries, the model has {} MoE layers",
                              command, f.layer_slots.size(), moe);
    }
    ec.pager.layer_slots.assign(geo.layers, 0);
    std::size_t k = 0;
    for (int l = 0; l < geo.layers; ++l) {
      if (geo.layer_is_moe[l]) ec.pager.layer_slots[l] = f.layer_slots[k++];
    }
  }
  ec.pager.budget_bytes = static_cast<std::size_t>(f.expert_budget_mib * 1024 * 1024);
  apply_serve_step_switches(f.step, ec);
  apply_miss_placement(f.miss, ec.pager);
  FERRY_TRY(apply_storage_dtypes(f.miss, ec));
  FERRY_ASSIGN_OR_RETURN(ec.pager.cpu_expert_kernel, cpu_expert_kernel_of(f.cpu_expert_kernel));
  ec.kv.budget_bytes = static_cast<std::size_t>(f.kv_budget_mib * 1024 * 1024);
  ec.kv.block_tokens = f.kv_block_tokens;
  ec.device_budget_bytes = static_cast<std::size_t>(f.device_budget_mib * 1024 * 1024);
  ec.max_batch_tokens = f.max_batch_tokens;
  ec.max_running = 1;
  return ec;
}

CLI::Option* add_engine_flags(CLI::App* cmd, EngineFlags& f, bool miss_link_flag) {
  cmd->add_option("--mode", f.mode, "expert mode: resident, static, cpu-experts, paged")
      ->envname("FERRY_EXPERT_MODE");
  auto* slots = cmd->add_option("--expert-slots", f.expert_slots, "pager slots per MoE layer")
                    ->check(CLI::Range(1, 1 << 20));
  auto* budget = cmd->add_option("--expert-budget-mib", f.expert_budget_mib,
                                 "expert device budget in MiB (slots = what fits)")
                     ->check(CLI::Range(0.0, 1e9));
  auto* layer_slots =
      cmd->add_option("--layer-slots", f.layer_slots, "pager slots of each MoE layer (list)")
          ->delimiter(',')
          ->check(CLI::Range(1, 1 << 20));
  slots->excludes(budget)->excludes(layer_slots);
  budget->excludes(layer_slots);
  cmd->add_option("--policy", f.policy, "pager eviction policy: lru, lfu, lfru");
  add_miss_placement_flags(cmd, f.miss, miss_link_flag);
  add_cpu_expert_kernel_flag(cmd, f.cpu_expert_kernel);
  cmd->add_option("--max-batch-tokens", f.max_batch_tokens,
                  "tokens per engine step (prefill chunk)")
      ->check(CLI::Range(1, 1 << 16));
  auto* kv_budget =
      cmd->add_option("--kv-budget-mib", f.kv_budget_mib, "KV block pool budget in MiB")
          ->check(CLI::Range(0.001, 1e9));
  cmd->add_option("--device-budget-mib", f.device_budget_mib,
                  "one device budget over KV blocks and expert slots/staging (0: none)")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--kv-block-tokens", f.kv_block_tokens, "tokens per KV block")
      ->check(CLI::Range(1, 4096));
  add_serve_device_flag(cmd, f.device);
  add_serve_step_switches(cmd, f.step);
  return kv_budget;
}

}  // namespace ferry::app
