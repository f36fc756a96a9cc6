// SPDX-License-Identifier: Apache-2.0
// Helpers shared by several subcommands (see commands.h).
#include <chrono>
#include <csignal>
#include <thread>

#include "apps/ferry/commands.h"

namespace ferry::app {
namespace {

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

}  // namespace

CLI::App* route_cmd(CLI::App& app) {
  auto found = app.get_subcommands([](CLI::App* a) { return a->get_name() == "route"; });
  if (!found.empty()) return found.front();
  auto* r = app.add_subcommand("route", "budget-adaptive edge-cloud routing (docs/route.md)");
  r->require_subcommand(1);
  return r;
}

CLI::App* bench_cmd(CLI::App& app) {
  auto found = app.get_subcommands([](CLI::App* a) { return a->get_name() == "bench"; });
  if (!found.empty()) return found.front();
  auto* b = app.add_subcommand("bench", "benchmarks of the systems (ferry bench serve)");
  b->require_subcommand(1);
  return b;
}

void install_stop_signals() {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
}

void wait_for_stop(double duration_s) {
  const auto start = std::chrono::steady_clock::now();
  while (!g_stop) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (duration_s > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
            duration_s) {
      return;
    }
  }
}

}  // namespace ferry::app
