// SPDX-License-Identifier: Apache-2.0
// ferry: one binary, one subcommand per job (cmd_*.cpp register themselves). Parse errors exit 2;
// runtime Status errors exit 1. Logs go to stderr, results to stdout.
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "apps/ferry/commands.h"
#include "core/log.h"

namespace ferry::app {

int fail(const Status& s) {
  std::fprintf(stderr, "ferry: %s\n", s.to_string().c_str());
  return 1;
}

std::vector<RegisterFn>& command_registry() {
  static std::vector<RegisterFn> fns;
  return fns;
}

}  // namespace ferry::app

int main(int argc, char** argv) {
  using namespace ferry;
  log::init_from_env();
  CLI::App app{"ferry: run, train and route models that do not fit the hardware they are on"};
  app.require_subcommand(1);
  std::string log_level;
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, off")
      ->envname("FERRY_LOG_LEVEL");

  app::CommandFn run;
  for (app::RegisterFn reg : app::command_registry()) reg(app, run);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (!log_level.empty()) {
    if (const Status s = log::set_level(log_level); !s.ok()) return app::fail(s);
  }
  return run ? run() : 2;
}
