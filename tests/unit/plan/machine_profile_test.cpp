// SPDX-License-Identifier: Apache-2.0
// The machine profiler (plan/machine_profile.h): a short real measurement on this machine gives
// positive rates for what it can measure and names what it cannot (no GPU in CI) with a reason;
// every rate is accounted for exactly once; the JSON round-trips and refuses malformed files;
// only measured rates override the assumed MachineSpec, and the cost model follows them; NVMe
// is measured one record at a time as the executor moves boundaries, and invalid NVMe sizes are a
// Status.
#include "plan/machine_profile.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "plan/geometry.h"

namespace ferry::plan {
namespace {

const char* const kAllFields[] = {"gemm_tflops",
                                  "attn_fwd_tflops",
                                  "attn_bwd_tflops",
                                  "hbm_gbps",
                                  "h2d_gbps",
                                  "d2h_gbps",
                                  "duplex_gbps",
                                  "duplex_loaded_gbps",
                                  "nvme_read_gbps",
                                  "nvme_write_gbps",
                                  "cpu_optimizer_gparams_per_s"};

MachineProfileOptions small_options(const std::string& nvme_dir) {
  MachineProfileOptions o;
  o.machine = "unit-test";
  o.nvme_dir = nvme_dir;
  o.link_bytes = 4u << 20;
  o.nvme_record_bytes = 4u << 20;
  o.nvme_bytes = 16u << 20;
  o.optimizer_params = 1u << 18;
  o.gemm_tokens = 256;
  o.attention_tokens = 512;
  o.seq_len = 256;
  o.reps = 2;
  return o;
}

TEST(MachineProfile, MeasuresWhatThisMachineHasAndNamesTheRest) {
  auto cfg = builtin_geometry("qwen2.5-0.5b");
  ASSERT_TRUE(cfg.ok());
  const std::string dir =
      fmt::format("{}/ferry_machine_profile.{}", ::testing::TempDir(), getpid());
  auto p = measure_machine(*cfg, small_options(dir));
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  std::set<std::string> seen;
  for (const std::string& f : p->measured) EXPECT_TRUE(seen.insert(f).second) << f;
  for (const NotMeasured& n : p->not_measured) {
    EXPECT_TRUE(seen.insert(n.field).second) << n.field;
    EXPECT_FALSE(n.why.empty()) << n.field;
  }
  EXPECT_EQ(seen.size(), std::size(kAllFields));
  for (const char* f : kAllFields) EXPECT_EQ(seen.count(f), 1u) << f;
  // The CPU optimizer and the NVMe store exist on every machine.
  const std::set<std::string> measured(p->measured.begin(), p->measured.end());
  EXPECT_TRUE(measured.count("cpu_optimizer_gparams_per_s"));
  EXPECT_TRUE(measured.count("nvme_read_gbps"));
  EXPECT_TRUE(measured.count("nvme_write_gbps"));
  EXPECT_GT(p->spec.cpu_optimizer_gparams_per_s, 0.0);
  EXPECT_GT(p->spec.link.nvme_read_gbps, 0.0);
  EXPECT_GT(p->spec.link.nvme_write_gbps, 0.0);
  if (p->gpu == "none") {
    EXPECT_FALSE(measured.count("h2d_gbps"));
    EXPECT_FALSE(measured.count("gemm_tflops"));
  } else {
    EXPECT_GT(p->spec.gemm_tflops, 0.0);
    EXPECT_GT(p->spec.link.duplex_gbps, 0.0);
  }
}

std::string temp_nvme_dir(const char* what) {
  return fmt::format("{}/ferry_machine_profile_{}.{}", ::testing::TempDir(), what, getpid());
}

// NVMe is measured the way the executor moves boundaries: records of the given size one at a
// time, written then read back; the profile says so. Only that the rates exist is checked, never
// their values.
TEST(MachineProfile, NvmeIsMeasuredOneRecordAtATimeAsTheExecutorDoes) {
  auto cfg = builtin_geometry("qwen2.5-0.5b");
  ASSERT_TRUE(cfg.ok());
  const std::string dir = temp_nvme_dir("pattern");
  auto p = measure_machine(*cfg, small_options(dir));  // 4 records of 4 MiB
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_GT(p->spec.link.nvme_write_gbps, 0.0);
  EXPECT_GT(p->spec.link.nvme_read_gbps, 0.0);
  EXPECT_TRUE(std::isfinite(p->spec.link.nvme_write_gbps));
  EXPECT_TRUE(std::isfinite(p->spec.link.nvme_read_gbps));
  const std::string& by = p->measured_by;
  EXPECT_NE(by.find("NVMe: 4 records of 4 MiB one at a time"), std::string::npos) << by;
  EXPECT_NE(by.find("written in order then read back last first, pageable staging"),
            std::string::npos)
      << by;
  EXPECT_NE(by.find("median of 2 passes"), std::string::npos) << by;
  EXPECT_NE(by.find("O_DIRECT"), std::string::npos) << by;  // or "refused O_DIRECT"
}

// A record that is not a multiple of the store's 4 KiB alignment is measured as the executor's
// is: the store moves it rounded up.
TEST(MachineProfile, NvmeRecordOfAnySizeIsMeasured) {
  auto cfg = builtin_geometry("qwen2.5-0.5b");
  ASSERT_TRUE(cfg.ok());
  const std::string dir = temp_nvme_dir("unaligned");
  MachineProfileOptions o = small_options(dir);
  o.nvme_record_bytes = (1u << 20) + 100;
  o.nvme_bytes = 3 * o.nvme_record_bytes + 5;  // 3 whole records
  auto p = measure_machine(*cfg, o);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_GT(p->spec.link.nvme_write_gbps, 0.0);
  EXPECT_GT(p->spec.link.nvme_read_gbps, 0.0);
  EXPECT_TRUE(std::isfinite(p->spec.link.nvme_read_gbps));
  EXPECT_NE(p->measured_by.find("NVMe: 3 records of 1048676 bytes"), std::string::npos)
      << p->measured_by;
}

TEST(MachineProfile, InvalidNvmeSizesAreAStatusNotAnAbort) {
  auto cfg = builtin_geometry("qwen2.5-0.5b");
  ASSERT_TRUE(cfg.ok());
  const std::string dir = temp_nvme_dir("invalid");
  auto refused = [&](std::size_t record, std::size_t total, const char* want) {
    MachineProfileOptions o = small_options(dir);
    o.nvme_record_bytes = record;
    o.nvme_bytes = total;
    auto p = measure_machine(*cfg, o);
    ASSERT_FALSE(p.ok()) << want;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << p.status().to_string();
    EXPECT_NE(p.status().message().find(want), std::string::npos) << p.status().to_string();
  };
  refused(0, 16u << 20, "record of 0 bytes");
  refused(0, 0, "record of 0 bytes");
  refused(32u << 20, 16u << 20, "record of 32 MiB is larger than the 16 MiB");
  refused((4u << 20) + 1, 4u << 20, "record of 4194305 bytes is larger than the 4 MiB");
  std::filesystem::remove_all(dir);
  // Without --nvme-dir the NVMe sizes are not used and not checked.
  MachineProfileOptions o = small_options("");
  o.nvme_record_bytes = 0;
  EXPECT_TRUE(measure_machine(*cfg, o).ok());
}

TEST(MachineProfile, WithoutNvmeDirNvmeIsNotMeasured) {
  auto cfg = builtin_geometry("qwen2.5-0.5b");
  ASSERT_TRUE(cfg.ok());
  auto p = measure_machine(*cfg, small_options(""));
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  bool named = false;
  for (const NotMeasured& n : p->not_measured) named |= n.field == "nvme_read_gbps";
  EXPECT_TRUE(named);
}

MachineProfile hand_made() {
  MachineProfile p;
  p.machine = "box";
  p.measured_by = "unit test";
  p.gpu = "none";
  p.cpu_threads = 2;
  p.spec.link.h2d_gbps = 12.5;
  p.spec.cpu_optimizer_gparams_per_s = 0.25;
  p.measured = {"h2d_gbps", "cpu_optimizer_gparams_per_s"};
  p.not_measured = {{"gemm_tflops", "no CUDA device"}};
  return p;
}

TEST(MachineProfile, JsonRoundTripsAndOnlyMeasuredRatesOverride) {
  const std::string path = ::testing::TempDir() + "/ferry_machine_profile.json";
  ASSERT_TRUE(write_machine_profile(path, hand_made()).ok());
  auto back = read_machine_profile(path);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->measured, hand_made().measured);
  ASSERT_EQ(back->not_measured.size(), 1u);
  EXPECT_EQ(back->not_measured[0].why, "no CUDA device");

  MachineSpec spec;  // the assumed defaults
  const MachineSpec assumed;
  apply_machine_profile(*back, spec);
  EXPECT_EQ(spec.link.h2d_gbps, 12.5);
  EXPECT_EQ(spec.cpu_optimizer_gparams_per_s, 0.25);
  EXPECT_EQ(spec.gemm_tflops, assumed.gemm_tflops);  // not measured: stays assumed
  EXPECT_EQ(spec.link.d2h_gbps, assumed.link.d2h_gbps);
  EXPECT_EQ(spec.name, "box");
}

TEST(MachineProfile, CostModelFollowsTheMeasuredRates) {
  auto cfg = builtin_geometry("qwen2.5-0.5b");
  ASSERT_TRUE(cfg.ok());
  const TrainShape shape{.batch_size = 4, .seq_len = 512};
  const Capacities caps{.gpu_gb = 24, .host_gb = 64};
  MachineSpec fast, slow;
  apply_machine_profile(hand_made(), slow);  // 12.5 GB/s h2d, 0.25 Gparam/s optimizer
  auto pf = analytic_problem(*cfg, fast, shape, caps);
  auto ps = analytic_problem(*cfg, slow, shape, caps);
  ASSERT_TRUE(pf.ok() && ps.ok());
  EXPECT_EQ(ps->link.h2d_gbps, 12.5);
  EXPECT_GT(ps->cpu_optimizer_ms, 7.0 * pf->cpu_optimizer_ms);  // 2.0 vs 0.25 Gparam/s
}

TEST(MachineProfile, MalformedFilesAreRefused) {
  Json good = to_json(hand_made());
  auto check = [](Json j, const char* what) {
    auto r = machine_profile_from_json(j);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), StatusCode::kCorrupt) << what;
  };
  Json j = good;
  j["format"] = "ferry-plan-profile";
  check(j, "other format");
  j = good;
  j["measured"].push_back("warp_speed");
  check(j, "unknown field");
  j = good;
  j["rates"]["h2d_gbps"] = 0.0;
  check(j, "measured rate not positive");
  j = good;
  j["rates"].erase("gemm_tflops");
  check(j, "missing rate");
}

}  // namespace
}  // namespace ferry::plan
