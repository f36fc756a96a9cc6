// SPDX-License-Identifier: Apache-2.0
// `ferry version`: git hash, build type, compiled backends, CUDA runtime/driver and devices.
#include <cstdio>

#include "apps/ferry/commands.h"
#include "kernels/backend.h"
#include "mem/device_info.h"

namespace ferry::app {
namespace {

int run_version() {
  std::printf("ferry %s (git %s, %s build)\n", FERRY_VERSION_STRING, FERRY_GIT_HASH,
              FERRY_BUILD_TYPE);
  const mem::CudaInfo info = mem::query_cuda_info();
  std::printf("backends: reference, cpu%s\n", info.compiled ? ", cuda" : "");
  if (!info.compiled) {
    std::printf("cuda: not compiled in (built without nvcc)\n");
    return 0;
  }
  std::printf("cuda: runtime %s, driver %s\n", info.runtime_version.c_str(),
              info.driver_version.c_str());
  if (!info.error.empty()) std::printf("cuda: %s\n", info.error.c_str());
  for (const auto& d : info.devices) {
    std::printf("device %d: %s, sm_%d%d, %.1f GiB\n", d.index, d.name.c_str(), d.cc_major,
                d.cc_minor, static_cast<double>(d.total_bytes) / double(1ull << 30));
  }
  if (info.devices.empty()) std::printf("devices: none found\n");
  return 0;
}

void register_version(CLI::App& app, CommandFn& run) {
  auto* cmd = app.add_subcommand("version", "print version, build and device information");
  cmd->callback([&run] { run = run_version; });
}

}  // namespace
FERRY_REGISTER_COMMAND(register_version);
}  // namespace ferry::app
