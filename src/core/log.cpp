// SPDX-License-Identifier: Apache-2.0
#include "core/log.h"

#include <cstdlib>
#include <mutex>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace ferry::log {
namespace {
std::mutex g_mu;
spdlog::level::level_enum g_level = spdlog::level::info;
}  // namespace

std::shared_ptr<spdlog::logger> get(std::string_view subsystem) {
  std::lock_guard lock(g_mu);
  const std::string name(subsystem);
  if (auto existing = spdlog::get(name)) return existing;
  auto logger = spdlog::stderr_color_mt(name);
  logger->set_level(g_level);
  logger->set_pattern("[%H:%M:%S.%e] [%n] [%^%l%$] %v");
  return logger;
}

Status set_level(std::string_view level) {
  const auto lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") {
    return invalid_argument("log: unknown level '{}' (trace, debug, info, warn, error, off)",
                            level);
  }
  std::lock_guard lock(g_mu);
  g_level = lvl;
  spdlog::apply_all([lvl](const std::shared_ptr<spdlog::logger>& l) { l->set_level(lvl); });
  return {};
}

void init_from_env() {
  if (const char* env = std::getenv("FERRY_LOG_LEVEL")) (void)set_level(env);
}

}  // namespace ferry::log
