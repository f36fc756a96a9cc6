// SPDX-License-Identifier: Apache-2.0
// Logging: one named spdlog logger per subsystem, all writing to stderr (results go to stdout).
// Level from set_log_level() (the CLI's --log-level) or FERRY_LOG_LEVEL.
//   ferry::log::get("pager")->info("evict expert={} layer={}", e, l);
#pragma once

#include <memory>
#include <string_view>

#include <spdlog/spdlog.h>

#include "core/status.h"

namespace ferry::log {

// Returns the logger for a subsystem ("train", "pager", "mem", ...), creating it on first use.
// Thread-safe.
std::shared_ptr<spdlog::logger> get(std::string_view subsystem);

// "trace", "debug", "info", "warn", "error", "off". Applies to all current and future loggers.
Status set_level(std::string_view level);

// Reads FERRY_LOG_LEVEL if set (called once by the CLI before parsing flags).
void init_from_env();

}  // namespace ferry::log
