// SPDX-License-Identifier: Apache-2.0
#include "model/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "core/file_util.h"
#include "core/json.h"
#include "core/log.h"
#include "model/model_dir.h"

namespace ferry::model {

namespace fs = std::filesystem;

Status Checkpoint::add_shard(std::unique_ptr<SafetensorsFile> shard) {
  for (const TensorInfo& t : shard->tensors()) {
    const auto [it, inserted] = entries_.emplace(t.name, Entry{shard.get(), &t});
    if (!inserted) {
      return corrupt("model: tensor {} appears in two shards: {} and {}", t.name,
                     it->second.file->path(), shard->path());
    }
  }
  shards_.push_back(std::move(shard));
  return {};
}

Result<Checkpoint> Checkpoint::open_file(const std::string& safetensors_path) {
  FERRY_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(safetensors_path));
  Checkpoint c;
  c.path_ = safetensors_path;
  FERRY_TRY(c.add_shard(std::make_unique<SafetensorsFile>(std::move(f))));
  return c;
}

Result<Checkpoint> Checkpoint::open_index(const std::string& index_path) {
  FERRY_ASSIGN_OR_RETURN(const std::string text, read_file(index_path));
  FERRY_ASSIGN_OR_RETURN(const Json j, parse_json(text, index_path));
  if (!j.is_object()) return corrupt("model: {}: not a JSON object", index_path);
  const auto wm = j.find("weight_map");
  if (wm == j.end() || !wm->is_object()) {
    return corrupt("model: {}: missing or non-object \"weight_map\"", index_path);
  }
  const fs::path dir = fs::path(index_path).parent_path();

  // Shard file -> tensor names the index assigns to it (ordered, so errors are deterministic).
  std::map<std::string, std::vector<std::string>> by_shard;
  for (const auto& [name, file] : wm->items()) {
    if (!file.is_string()) {
      return corrupt("model: {}: weight_map entry for {} is not a string", index_path, name);
    }
    const std::string& f = file.get_ref<const std::string&>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      return corrupt("model: {}: weight_map entry for {} names an invalid shard \"{}\"", index_path,
                     name, f);
    }
    by_shard[f].push_back(name);
  }

  Checkpoint c;
  c.path_ = index_path;
  for (const auto& [file, names] : by_shard) {
    const std::string shard_path = (dir / file).string();
    auto shard = SafetensorsFile::open(shard_path);
    if (!shard.ok()) {
      if (shard.status().code() == StatusCode::kNotFound) {
        return not_found("model: {}: shard {} (referenced by {} tensors, e.g. {}) does not exist",
                         index_path, shard_path, names.size(), names.front());
      }
      return shard.status();
    }
    for (const std::string& n : names) {
      if (shard->find(n) == nullptr) {
        return corrupt("model: {}: weight_map puts tensor {} in {}, which does not contain it",
                       index_path, n, shard_path);
      }
    }
    auto owned = std::make_unique<SafetensorsFile>(std::move(shard).value());
    std::size_t unlisted = 0;
    for (const TensorInfo& t : owned->tensors()) {
      if (!wm->contains(t.name)) ++unlisted;
    }
    if (unlisted > 0) {
      log::get("model")->warn("shard={} unlisted_tensors={} (not in {}; served anyway)", shard_path,
                              unlisted, index_path);
    }
    FERRY_TRY(c.add_shard(std::move(owned)));
  }
  return c;
}

Result<Checkpoint> Checkpoint::open(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const std::string index = safetensors_index_path(path);
    if (fs::exists(index, ec)) return open_index(index);
    const std::string single = path + "/model.safetensors";
    if (fs::exists(single, ec)) return open_file(single);
    return not_found("model: {} has neither model.safetensors nor model.safetensors.index.json",
                     path);
  }
  if (!fs::exists(path, ec)) return not_found("model: {} does not exist", path);
  if (path.size() >= 5 && path.ends_with(".json")) return open_index(path);
  return open_file(path);
}

const Checkpoint::Entry* Checkpoint::find(std::string_view name) const {
  const auto it = entries_.find(std::string(name));
  return it == entries_.end() ? nullptr : &it->second;
}

Result<Checkpoint::Entry> Checkpoint::get(std::string_view name) const {
  const Entry* e = find(name);
  if (e == nullptr) return not_found("model: tensor {} not found in checkpoint {}", name, path_);
  return *e;
}

Result<ConstTensorView> Checkpoint::view(std::string_view name) const {
  FERRY_ASSIGN_OR_RETURN(const Entry e, get(name));
  return e.file->view(*e.info);
}

Result<ConstTensorView> Checkpoint::view(std::string_view name, DType dtype,
                                         std::span<const std::int64_t> shape) const {
  FERRY_ASSIGN_OR_RETURN(const Entry e, get(name));
  FERRY_TRY(check_tensor(*e.info, dtype, shape, e.file->path()));
  return e.file->view(*e.info);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& [n, e] : entries_) out.push_back(n);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace ferry::model
