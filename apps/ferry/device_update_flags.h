// SPDX-License-Identifier: Apache-2.0
// `--device-update-layers K|all` and `--device-update-slots S` of `ferry train` and `ferry bench
// train` (stream executor; device_optimizer_tail.h): the device updates up to K layers of the
// optimizer phase from the bottom while the CPU worker takes the globals and then the layers
// from the top, until they meet; `all` lets every layer go to the device (the meeting point
// decides; stored as stream::kDeviceUpdateAllLayers). S staging slots let one layer's H2D run
// while the previous layer's kernels and D2H run. `--head-update` places the globals' head part
// in the CPU worker's order.
#pragma once

#include <cstdlib>
#include <string>

#include <CLI/CLI.hpp>

#include "train/stream/device_optimizer_tail.h"
#include "train/stream/resident_layers.h"

namespace ferry::app {

// `--device-update-layers auto` (ferry plan, ferry train --plan): the planner chooses the tail
// (plan/device_tail.h); ferry bench train: a plan=FILE policy runs its plan's tail. Apart from
// kDeviceUpdateAllLayers (-1) and the layer counts.
inline constexpr int kDeviceUpdateAuto = train::stream::kDeviceUpdateAuto;

// Which command's --plan the tail flag's `auto` refers to.
enum class TailAuto { kNone, kTrainPlan, kBenchPlan };

// Accepts an integer in [0, 4096] or `all` (rewritten to kDeviceUpdateAllLayers before CLI11
// converts it to int), and with allow_auto `auto` (rewritten to kDeviceUpdateAuto).
inline CLI::Validator layers_or_all(bool allow_auto = false) {
  return CLI::Validator(
      [allow_auto](std::string& s) -> std::string {
        if (s == "all") {
          s = std::to_string(train::stream::kDeviceUpdateAllLayers);
          return {};
        }
        if (allow_auto && s == "auto") {
          s = std::to_string(kDeviceUpdateAuto);
          return {};
        }
        char* end = nullptr;
        const long v = std::strtol(s.c_str(), &end, 10);
        if (s.empty() || *end != '\0' || v < 0 || v > 4096) {
          return std::string("must be an integer in [0, 4096]") +
                 (allow_auto ? ", all or auto" : " or all") + ", not " + s;
        }
        return {};
      },
      allow_auto ? "INT|all|auto" : "INT|all");
}

// with_plan: kTrainPlan, ferry train, whose --plan FILE|auto carries a tail: not given (or
// auto), a plan file's tail runs; `auto` with --plan auto lets the planner choose it.
// kBenchPlan, ferry bench train: not given or auto, a plan=FILE policy runs its plan's tail and
// the named policies none; K or all: every policy runs that.
inline void add_device_update_flags(CLI::App* cmd, int& layers, int& slots, const char* prefix,
                                    TailAuto with_plan = TailAuto::kNone) {
  const char* plan_help = "";
  if (with_plan == TailAuto::kTrainPlan) {
    plan_help =
        ". With --plan FILE the plan's tail runs unless K or all is given; auto: with --plan "
        "auto the planner chooses K (the fastest predicted step; ties: the smaller K), with "
        "--plan FILE the plan's";
  } else if (with_plan == TailAuto::kBenchPlan) {
    plan_help =
        ". auto (the default): a plan=FILE policy runs the tail its plan was solved with (ferry "
        "plan --device-update-layers), the named policies none; K or all: every policy";
  }
  cmd->add_option("--device-update-layers", layers,
                  std::string(prefix) +
                      "the device updates up to K layers in the optimizer phase, claiming 0, 1, "
                      "... while the CPU worker takes the globals and then L-1, L-2, ... until "
                      "they meet (bit-identical; needs 8-bit states or a bf16 master for the "
                      "device's layers); all: every layer may go to the device, the meeting point "
                      "decides; 0: the CPU updates all. With --resident-layers R the tail works on "
                      "the non-resident layers only: it claims R, R+1, ... and all means L-R" +
                      plan_help)
      ->envname("FERRY_DEVICE_UPDATE_LAYERS")
      ->transform(layers_or_all(with_plan != TailAuto::kNone));
  cmd->add_option("--device-update-slots", slots,
                  std::string(prefix) +
                      "device-update staging slots (layers in flight: one's H2D overlaps the "
                      "previous one's kernels and D2H); each holds one layer's optimizer state in "
                      "the device budget")
      ->envname("FERRY_DEVICE_UPDATE_SLOTS")
      ->check(CLI::Range(1, train::stream::kMaxDeviceUpdateSlots));
}

// `--device-update-ms-per-layer MS` (ferry plan, ferry train --plan auto): the device tail's
// measured time per layer in the planner's optimizer gate
// (PlanProblem::device_update_ms_per_layer); 0 (default): a measured profile's (ferry plan
// --from-bench takes it from a bench run with the tail), else derived (the layer's share of the
// host model state over the H2D rate).
inline void add_device_update_ms_flag(CLI::App* cmd, double& ms, const char* prefix) {
  cmd->add_option("--device-update-ms-per-layer", ms,
                  std::string(prefix) +
                      "the device optimizer tail's time per layer for the planner (measured: "
                      "ferry bench train's device_update_busy_s per unit); 0: the measured "
                      "profile's when it has one (ferry plan --from-bench), else the layer's share "
                      "of the host model state over the H2D rate")
      ->envname("FERRY_DEVICE_UPDATE_MS_PER_LAYER")
      ->check(CLI::Range(0.0, 1e6));
}

// `--resident-layers K|all|auto`: layers 0..K-1 stay on the GPU for the whole run (weights,
// master, optimizer states, gradients; resident_layers.h), updated there in place.
inline void add_resident_layers_flag(CLI::App* cmd, int& layers, const char* prefix) {
  cmd->add_option("--resident-layers", layers,
                  std::string(prefix) +
                      "keep the first K decoder layers on the GPU for the whole run (bf16 weights, "
                      "master, AdamW states, gradients in the device budget): no weight "
                      "streaming, gradient D2H or CPU update for them, their update runs on the "
                      "GPU in place (bit-identical; needs 8-bit states or a bf16 master); all: "
                      "every layer; auto: the most that fit the device budget at this batch; a K "
                      "that does not fit is refused naming the largest that does; 0: none")
      ->envname("FERRY_RESIDENT_LAYERS")
      ->transform(CLI::Validator(
          [](std::string& s) -> std::string {
            if (s == "auto") {
              s = std::to_string(train::stream::kResidentAuto);
              return {};
            }
            if (s == "all") {
              s = std::to_string(train::stream::kResidentAllLayers);
              return {};
            }
            char* end = nullptr;
            const long v = std::strtol(s.c_str(), &end, 10);
            if (s.empty() || *end != '\0' || v < 0 || v > 4096) {
              return "must be an integer in [0, 4096], all or auto, not " + s;
            }
            return {};
          },
          "INT|all|auto"));
}

// `--device-update-prestage true|false`: the device tail copies its first layers' optimizer
// states (all but the gradients) into its staging slots during the last micro-batch's backward.
inline void add_device_prestage_flag(CLI::App* cmd, bool& prestage, const char* prefix) {
  cmd->add_option("--device-update-prestage", prestage,
                  std::string(prefix) +
                      "with --device-update-layers: copy the first layers' optimizer states (all "
                      "but the gradients; one layer per staging slot) to the device during the "
                      "last micro-batch's backward, so that only their gradients go up after it")
      ->envname("FERRY_DEVICE_UPDATE_PRESTAGE");
}

// `--head-update early|late`: where the CPU worker updates the final norm + lm_head (the next
// forward waits for them only at its head; for the embedding before its first layer).
inline void add_head_update_flag(CLI::App* cmd, std::string& head, const char* prefix) {
  cmd->add_option("--head-update", head,
                  std::string(prefix) +
                      "when the CPU worker updates the final norm + lm_head: early (right after "
                      "the embedding, before the layers) or late (after its last layer); the "
                      "next forward waits for them only at its head (bit-identical either way)")
      ->envname("FERRY_HEAD_UPDATE")
      ->check(CLI::IsMember({"early", "late"}));
}

}  // namespace ferry::app
