// SPDX-License-Identifier: Apache-2.0
// The paged mode's miss-placement flags and the storage dtypes of the weights and the KV cache
// (serve_config.h PagerConfig::expert_dtype, EngineConfig::dense_dtype, KvConfig::dtype), shared
// by `ferry generate`, `ferry serve` and `ferry bench serve` (which has its own --expert-dtype and
// --dense-dtype and --kv-dtype).
#pragma once

#include <cmath>
#include <string>

#include <CLI/CLI.hpp>

#include "serve/serve_config.h"

namespace ferry::app {

struct MissPlacementFlags {
  bool cost_model = false;
  double link_gbps = 24;
  double cpu_gflops = 50;
  bool cpu_gflops_auto = false;  // --cpu-gflops auto: PagerConfig::measure_cpu_gflops
  int bypass_window = 0;
  bool serial_copies = false;  // PagerConfig::overlap_misses = false
  std::string expert_dtype;    // with_dtype: "f32" (default) or "bf16"
  std::string dense_dtype;     // with_dtype: "f32" (default) or "bf16"
  std::string kv_dtype;        // with_dtype: "f32" (default) or "bf16"
};

// with_link: also registers --link-gbps (a command that already has its own --link-gbps, like
// `ferry serve` for MV-WSA, copies that value into link_gbps instead: it is the same link).
inline void add_miss_placement_flags(CLI::App* cmd, MissPlacementFlags& f, bool with_link,
                                     bool with_dtype = true) {
  if (with_dtype) {
    cmd->add_option("--expert-dtype", f.expert_dtype,
                    "routed experts stored, copied and read in f32 (default) or bf16 (--device "
                    "cuda only; f32 accumulation)")
        ->check(CLI::IsMember({"f32", "bf16"}));
    cmd->add_option("--dense-dtype", f.dense_dtype,
                    "dense weights (attention, router, lm_head, embedding) stored in f32 "
                    "(default) or bf16: half their bytes, f32 arithmetic on the widened weights "
                    "(the f32 engine's bits on the weights rounded to bf16)")
        ->check(CLI::IsMember({"f32", "bf16"}));
    cmd->add_option("--kv-dtype", f.kv_dtype,
                    "KV cache stored in f32 (default) or bf16: half the bytes per block (twice "
                    "the blocks for --kv-budget-mib), rows rounded to nearest even when written, "
                    "f32 attention on the widened rows")
        ->check(CLI::IsMember({"f32", "bf16"}));
  }
  cmd->add_flag("--miss-cost-model", f.cost_model,
                "paged: compute a miss on the CPU from host memory when that beats copying it");
  if (with_link) {
    cmd->add_option("--link-gbps", f.link_gbps, "host->device GB/s the miss cost model assumes")
        ->check(CLI::Range(1e-9, 1e6));
  }
  // F (an assumed rate) or auto (this machine's, measured when the engine starts:
  // serve/cpu_expert_rate.h).
  const CLI::Validator rate_or_auto(
      [](std::string& v) -> std::string {
        if (v == "auto") return {};
        std::size_t used = 0;
        double g = 0;
        try {
          g = std::stod(v, &used);
        } catch (...) {
          used = 0;
        }
        if (used != v.size() || !std::isfinite(g) || g < 1e-9 || g > 1e9) {
          return "a rate in GFLOP/s in [1e-9, 1e9] or auto, not '" + v + "'";
        }
        return {};
      },
      "F|auto");
  cmd->add_option_function<std::string>(
         "--cpu-gflops",
         [&f](const std::string& v) {
           f.cpu_gflops_auto = v == "auto";
           if (!f.cpu_gflops_auto) f.cpu_gflops = std::stod(v);  // the validator checked it
         },
         "CPU expert GFLOP/s the miss cost model assumes (default 50), or auto: measure this "
         "machine's at engine start (the host path's CPU kernel on one row of one expert, over "
         "distinct experts of the host store; reported)")
      ->check(rate_or_auto);
  cmd->add_option("--bypass-window", f.bypass_window,
                  "paged: bypass admission - a miss that would evict and was unused in the "
                  "layer's last N steps is computed from host memory instead (0: off)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_flag("--serial-miss-copies", f.serial_copies,
                "paged on CUDA: compute waits for a group's whole miss batch, no overlap with the "
                "resident experts' rows (the pre-overlap order, for comparison; same bits)");
}

inline void apply_miss_placement(const MissPlacementFlags& f, serve::PagerConfig& pc) {
  pc.miss_cost_model = f.cost_model;
  pc.link_gbps = f.link_gbps;
  pc.cpu_gflops = f.cpu_gflops;
  pc.measure_cpu_gflops = f.cpu_gflops_auto;
  pc.bypass_window = f.bypass_window;
  pc.overlap_misses = !f.serial_copies;
  if (f.expert_dtype == "bf16") pc.expert_dtype = DType::kBF16;  // CLI checked the spelling
}

// The dense weights' and the KV cache's dtypes (unset: f32).
inline Status apply_storage_dtypes(const MissPlacementFlags& f, serve::EngineConfig& ec) {
  if (!f.dense_dtype.empty()) {
    FERRY_ASSIGN_OR_RETURN(ec.dense_dtype, serve::parse_dense_dtype(f.dense_dtype));
  }
  if (!f.kv_dtype.empty()) {
    FERRY_ASSIGN_OR_RETURN(ec.kv.dtype, serve::parse_kv_dtype(f.kv_dtype));
  }
  return ok_status();
}

}  // namespace ferry::app
