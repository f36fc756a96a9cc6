// SPDX-License-Identifier: Apache-2.0
#include "train/train_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/file_util.h"
#include "core/json.h"
#include "core/log.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"

namespace ferry::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStateFile = "state.safetensors";
constexpr const char* kTrainerStateFile = "trainer_state.json";
constexpr int kFormatVersion = 1;

Status fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return errno_status("train: open dir", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return errno_status("train: fsync dir", dir, err);
  return {};
}

Result<std::uint64_t> hash_file(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(const std::string bytes, read_file(path));
  return fnv1a64(bytes.data(), bytes.size());
}

std::string hex64(std::uint64_t v) { return fmt::format("{:016x}", v); }

std::int64_t checkpoint_step(const std::string& name) {
  const std::string prefix = "checkpoint-";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) return -1;
  std::int64_t v = 0;
  for (std::size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

ConstTensorView flat_const(const TensorView& v) {
  return ConstTensorView::contiguous(v.data, v.dtype, v.device, {v.numel()});
}

template <class T>
ConstTensorView flat_vec(const std::vector<T>& v, DType dt) {
  return ConstTensorView::contiguous(v.data(), dt, Device::kCpu,
                                     {static_cast<std::int64_t>(v.size())});
}

std::vector<std::string> q8_param_names(const TrainState& s) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < s.num_params(); ++i) {
    if (s.optim.params[i].q8()) names.push_back(s.master->named[i].first);
  }
  return names;
}

// Every tensor of the state file, by mode (see the header): weights under their HF names (f32
// master, or the bf16 weights themselves with the parameter's shape), then the optimizer's.
std::vector<model::NamedTensor> state_tensors(const TrainState& s) {
  std::vector<model::NamedTensor> t;
  const OptimMode& mode = s.optim.mode;
  for (std::size_t i = 0; i < s.num_params(); ++i) {
    const std::string& name = s.master->named[i].first;
    const ParamOptimState& p = s.optim.params[i];
    if (mode.master == MasterWeights::kF32) {
      t.push_back({name, s.master->named[i].second});
    } else {
      ConstTensorView w = s.master->named[i].second;
      w.data = p.w16.data();
      w.dtype = DType::kBF16;
      t.push_back({name, w});
      if (mode.master == MasterWeights::kBf16Kahan) {
        t.push_back({"optim.kahan." + name, flat_vec(p.comp16, DType::kBF16)});
      }
    }
    if (!p.q8()) {
      t.push_back({"optim.m." + name, flat_const(s.m->named[i].second)});
      t.push_back({"optim.v." + name, flat_const(s.v->named[i].second)});
    } else {
      t.push_back({"optim.m8." + name, flat_vec(p.m8, DType::kU8)});
      t.push_back({"optim.m_absmax." + name, flat_vec(p.m_absmax, DType::kF32)});
      t.push_back({"optim.v8." + name, flat_vec(p.v8, DType::kU8)});
      t.push_back({"optim.v_absmax." + name, flat_vec(p.v_absmax, DType::kF32)});
    }
  }
  return t;
}

}  // namespace

std::uint64_t fnv1a64(const void* data, std::size_t n, std::uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

std::uint64_t data_fingerprint(const std::vector<TokenizedExample>& data) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const TokenizedExample& ex : data) {
    h = fnv1a64(ex.ids.data(), ex.ids.size() * sizeof(std::int32_t), h);
    h = fnv1a64(ex.targets.data(), ex.targets.size() * sizeof(std::int32_t), h);
  }
  return h;
}

std::string checkpoint_dir_name(std::int64_t step) { return fmt::format("checkpoint-{}", step); }

std::vector<std::string> list_checkpoints(const std::string& output_dir) {
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(output_dir, ec)) {
    if (!e.is_directory(ec)) continue;
    const std::int64_t s = checkpoint_step(e.path().filename().string());
    if (s >= 0) found.emplace_back(s, e.path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a > b; });
  std::vector<std::string> out;
  for (auto& [s, p] : found) out.push_back(std::move(p));
  return out;
}

Status save_checkpoint(const std::string& output_dir, const TrainState& s, const TrainerState& ts,
                       int keep_last) {
  const std::string final_dir = output_dir + "/" + checkpoint_dir_name(ts.step);
  const std::string tmp_dir =
      fmt::format("{}/.{}.tmp-{}", output_dir, checkpoint_dir_name(ts.step), ::getpid());
  std::error_code ec;
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) return io_error("train: cannot create {}: {}", tmp_dir, ec.message());

  const std::vector<model::NamedTensor> tensors = state_tensors(s);
  const std::string state_path = tmp_dir + "/" + kStateFile;
  FERRY_TRY(model::write_safetensors(state_path, tensors, {{"format", "ferry-train"}}));
  FERRY_ASSIGN_OR_RETURN(const std::uint64_t hash, hash_file(state_path));
  Json j = {{"format_version", kFormatVersion},
            {"step", ts.step},
            {"opt_step", ts.opt_step},
            {"epoch", ts.cursor.epoch},
            {"index", ts.cursor.index},
            {"seed", hex64(ts.seed)},
            {"nonfinite_run", ts.nonfinite_run},
            {"data_fingerprint", hex64(ts.data_fingerprint)},
            {"state_fnv1a64", hex64(hash)},
            {"master_weights", to_string(s.optim.mode.master)},
            {"optimizer_states", to_string(s.optim.mode.states)}};
  if (s.optim.mode.states == OptimizerStates::k8Bit) j["q8_params"] = q8_param_names(s);
  FERRY_TRY(write_file_atomic(tmp_dir + "/" + kTrainerStateFile, j.dump(1) + "\n"));
  FERRY_TRY(fsync_dir(tmp_dir));
  if (fs::exists(final_dir, ec)) {  // re-saving a step (after a resume): replace it
    const std::string old = final_dir + ".old";
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    if (ec) return io_error("train: cannot move aside {}: {}", final_dir, ec.message());
    fs::rename(tmp_dir, final_dir, ec);
    if (ec) return io_error("train: cannot rename {} -> {}: {}", tmp_dir, final_dir, ec.message());
    fs::remove_all(old, ec);
  } else {
    fs::rename(tmp_dir, final_dir, ec);
    if (ec) return io_error("train: cannot rename {} -> {}: {}", tmp_dir, final_dir, ec.message());
  }
  FERRY_TRY(fsync_dir(output_dir));
  const std::vector<std::string> all = list_checkpoints(output_dir);
  for (std::size_t i = static_cast<std::size_t>(std::max(keep_last, 1)); i < all.size(); ++i) {
    fs::remove_all(all[i], ec);
  }
  return {};
}

namespace {

Result<std::uint64_t> parse_hex(const Json& j, const char* key, const std::string& what) {
  if (!j.contains(key) || !j[key].is_string()) return corrupt("{}: missing \"{}\"", what, key);
  const std::string s = j[key].get<std::string>();
  if (s.empty() || s.size() > 16) return corrupt("{}: bad \"{}\"", what, key);
  std::uint64_t v = 0;
  for (char c : s) {
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    if (d < 0) return corrupt("{}: bad \"{}\"", what, key);
    v = v * 16 + static_cast<std::uint64_t>(d);
  }
  return v;
}

Result<std::int64_t> parse_int(const Json& j, const char* key, const std::string& what) {
  if (!j.contains(key) || !j[key].is_number_integer()) {
    return corrupt("{}: missing integer \"{}\"", what, key);
  }
  return j[key].get<std::int64_t>();
}

// Copies tensor `name` into dst (n elements of dt), checking dtype and element count.
Status load_raw(const model::SafetensorsFile& f, const std::string& name, void* dst, std::int64_t n,
                DType dt) {
  const model::TensorInfo* info = f.find(name);
  if (info == nullptr) return corrupt("train: checkpoint {} lacks tensor {}", f.path(), name);
  FERRY_ASSIGN_OR_RETURN(const ConstTensorView v, f.view(*info));
  if (v.dtype != dt || v.numel() != n) {
    return corrupt("train: checkpoint {}: tensor {} has {} {} elements, the model needs {} {}",
                   f.path(), name, v.numel(), to_string(v.dtype), n, to_string(dt));
  }
  if (n > 0) std::memcpy(dst, v.data, static_cast<std::size_t>(n) * dtype_size(dt));
  return {};
}

Status load_tensor(const model::SafetensorsFile& f, const std::string& name,
                   const TensorView& dst) {
  return load_raw(f, name, dst.data, dst.numel(), DType::kF32);
}

template <class T>
Status load_vec(const model::SafetensorsFile& f, const std::string& name, std::vector<T>& dst,
                DType dt) {
  return load_raw(f, name, dst.data(), static_cast<std::int64_t>(dst.size()), dt);
}

Status load_param(const model::SafetensorsFile& f, TrainState& s, std::size_t i) {
  const std::string& name = s.master->named[i].first;
  ParamOptimState& p = s.optim.params[i];
  const OptimMode& mode = s.optim.mode;
  if (mode.master == MasterWeights::kF32) {
    FERRY_TRY(load_tensor(f, name, s.master->named[i].second));
  } else {
    FERRY_TRY(load_vec(f, name, p.w16, DType::kBF16));
    if (mode.master == MasterWeights::kBf16Kahan) {
      FERRY_TRY(load_vec(f, "optim.kahan." + name, p.comp16, DType::kBF16));
    }
  }
  if (!p.q8()) {
    FERRY_TRY(load_tensor(f, "optim.m." + name, s.m->named[i].second));
    FERRY_TRY(load_tensor(f, "optim.v." + name, s.v->named[i].second));
  } else {
    FERRY_TRY(load_vec(f, "optim.m8." + name, p.m8, DType::kU8));
    FERRY_TRY(load_vec(f, "optim.m_absmax." + name, p.m_absmax, DType::kF32));
    FERRY_TRY(load_vec(f, "optim.v8." + name, p.v8, DType::kU8));
    FERRY_TRY(load_vec(f, "optim.v_absmax." + name, p.v_absmax, DType::kF32));
  }
  return {};
}

// Which parameters keep 8-bit states; a checkpoint without the field (written before
// --8bit-params) has them all.
Status check_q8_selection(const Json& j, const TrainState& s, const std::string& dir,
                          const std::string& what) {
  if (s.optim.mode.states != OptimizerStates::k8Bit) return {};
  std::vector<std::string> saved;
  if (j.contains("q8_params")) {
    if (!j["q8_params"].is_array()) return corrupt("{}: bad \"q8_params\"", what);
    for (const Json& n : j["q8_params"]) {
      if (!n.is_string()) return corrupt("{}: bad \"q8_params\"", what);
      saved.push_back(n.get<std::string>());
    }
  } else {
    for (const auto& [name, t] : s.master->named) saved.push_back(name);
  }
  const std::vector<std::string> now = q8_param_names(s);
  if (saved == now) return {};
  std::string differ;
  for (const auto& [name, t] : s.master->named) {
    const bool in_saved = std::find(saved.begin(), saved.end(), name) != saved.end();
    const bool in_now = std::find(now.begin(), now.end(), name) != now.end();
    if (in_saved != in_now) {
      differ = fmt::format("{} is {} there and {} here", name, in_saved ? "8-bit" : "fp32",
                           in_now ? "8-bit" : "fp32");
      break;
    }
  }
  return invalid_argument(
      "train: checkpoint {} keeps 8-bit states for {} parameters but this run's --8bit-params "
      "selects {} ({}); resume with the same --8bit-params (states are not converted)",
      dir, saved.size(), now.size(), differ);
}

// Mode fields; checkpoints written before the hybrid optimizer have neither (fp32 / fp32).
Result<OptimMode> parse_mode(const Json& j, const std::string& what) {
  OptimMode m;
  if (j.contains("master_weights")) {
    if (!j["master_weights"].is_string()) return corrupt("{}: bad \"master_weights\"", what);
    auto mw = parse_master_weights(j["master_weights"].get<std::string>());
    if (!mw.ok()) return corrupt("{}: {}", what, mw.status().message());
    m.master = *mw;
  }
  if (j.contains("optimizer_states")) {
    if (!j["optimizer_states"].is_string()) return corrupt("{}: bad \"optimizer_states\"", what);
    auto st = parse_optimizer_states(j["optimizer_states"].get<std::string>());
    if (!st.ok()) return corrupt("{}: {}", what, st.status().message());
    m.states = *st;
  }
  return m;
}

}  // namespace

Result<TrainerState> load_checkpoint(const std::string& path, TrainState& s) {
  std::string dir = path;
  std::error_code ec;
  if (!fs::exists(dir + "/" + kTrainerStateFile, ec)) {
    const std::vector<std::string> all = list_checkpoints(path);
    if (all.empty()) return not_found("train: no checkpoint in {}", path);
    dir = all.front();
  }
  const std::string what = dir + "/" + kTrainerStateFile;
  auto fail = [&](const Status& st) {
    std::string msg = fmt::format("train: checkpoint {} is unusable: {}", dir, st.message());
    const std::string parent = fs::path(dir).parent_path().string();
    for (const std::string& other : list_checkpoints(parent)) {
      if (fs::path(other) != fs::path(dir)) {
        msg += fmt::format(" (an earlier checkpoint exists: --resume {})", other);
        break;
      }
    }
    return Status(StatusCode::kCorrupt, msg);
  };
  auto text = read_file(what);
  if (!text.ok()) return fail(text.status());
  auto parsed = parse_json(*text, what);
  if (!parsed.ok()) return fail(parsed.status());
  const Json& j = *parsed;
  auto version = parse_int(j, "format_version", what);
  if (!version.ok()) return fail(version.status());
  if (*version != kFormatVersion) {
    return fail(corrupt("format_version {} (this build reads {})", *version, kFormatVersion));
  }
  TrainerState ts;
  const char* keys[] = {"step", "opt_step", "epoch", "index", "nonfinite_run"};
  std::int64_t vals[5] = {};
  for (int k = 0; k < 5; ++k) {
    auto v = parse_int(j, keys[k], what);
    if (!v.ok()) return fail(v.status());
    vals[k] = *v;
  }
  ts.step = vals[0];
  ts.opt_step = vals[1];
  ts.cursor = {vals[2], vals[3]};
  ts.nonfinite_run = static_cast<int>(vals[4]);
  auto seed = parse_hex(j, "seed", what);
  auto fp = parse_hex(j, "data_fingerprint", what);
  auto want_hash = parse_hex(j, "state_fnv1a64", what);
  if (!seed.ok()) return fail(seed.status());
  if (!fp.ok()) return fail(fp.status());
  if (!want_hash.ok()) return fail(want_hash.status());
  ts.seed = *seed;
  ts.data_fingerprint = *fp;
  auto mode = parse_mode(j, what);
  if (!mode.ok()) return fail(mode.status());
  if (*mode != s.optim.mode) {
    return invalid_argument(
        "train: checkpoint {} holds {} but this run uses {}; resume with the same --master and "
        "--optimizer-states (states are not converted)",
        dir, describe(*mode), describe(s.optim.mode));
  }
  FERRY_TRY(check_q8_selection(j, s, dir, what));
  const std::string state_path = dir + "/" + kStateFile;
  auto got_hash = hash_file(state_path);
  if (!got_hash.ok()) return fail(got_hash.status());
  if (*got_hash != *want_hash) {
    return fail(corrupt("{} hash {} does not match the recorded {} (truncated or modified)",
                        state_path, hex64(*got_hash), hex64(*want_hash)));
  }
  auto file = model::SafetensorsFile::open(state_path);
  if (!file.ok()) return fail(file.status());
  for (std::size_t i = 0; i < s.num_params(); ++i) {
    if (Status st = load_param(*file, s, i); !st.ok()) return fail(st);
  }
  s.optim.refresh_compute_view(*s.master);
  s.refresh_compute();
  log::get("train")->info("resumed from {} step={} opt_step={} epoch={} index={}", dir, ts.step,
                          ts.opt_step, ts.cursor.epoch, ts.cursor.index);
  return ts;
}

Status export_hf_model(const std::string& dir, const TrainState& s, const std::string& config_json,
                       const std::map<std::string, std::string>& passthrough) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error("train: cannot create {}: {}", dir, ec.message());
  FERRY_ASSIGN_OR_RETURN(Json cfg, parse_json(config_json, "config.json"));
  cfg["dtype"] = "float32";
  if (cfg.contains("torch_dtype")) cfg["torch_dtype"] = "float32";
  std::vector<model::NamedTensor> tensors;
  for (const auto& [name, v] : s.master->named) tensors.push_back({name, v});
  FERRY_TRY(model::write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}}));
  FERRY_TRY(write_file_atomic(dir + "/config.json", cfg.dump(2) + "\n"));
  for (const auto& [name, text] : passthrough) {
    FERRY_TRY(write_file_atomic(dir + "/" + name, text));
  }
  return {};
}

}  // namespace ferry::train
