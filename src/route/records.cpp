// SPDX-License-Identifier: Apache-2.0
// Record folders (see records.h).
#include "route/records.h"

#include <sys/stat.h>

#include <set>
#include <unordered_map>

#include <fmt/format.h>

#include "core/file_util.h"
#include "route/csv.h"

namespace ferry::route {

RecordSet RecordSet::subset(const std::string& name) const {
  RecordSet out;
  std::set<int> keep;
  for (std::size_t i = 0; i < frames.size(); ++i) {
    if (split[i] != name) continue;
    keep.insert(frames[i]);
    out.frames.push_back(frames[i]);
    out.split.push_back(split[i]);
    for (const auto& [col, v] : scores) out.scores[col].push_back(v[i]);
  }
  for (const auto& [col, v] : scores) out.scores[col];  // keep columns even when empty
  for (const auto& g : gts) {
    if (keep.count(g.frame)) out.gts.push_back(g);
  }
  for (const auto& d : weak) {
    if (keep.count(d.frame)) out.weak.push_back(d);
  }
  for (const auto& d : strong) {
    if (keep.count(d.frame)) out.strong.push_back(d);
  }
  return out;
}

Result<RecordSet> load_records(const std::string& dir) {
  RecordSet r;
  FERRY_ASSIGN_OR_RETURN(CsvTable t, CsvTable::load(dir + "/frames.csv"));
  if (!t.has_column("frame_id") || !t.has_column("split")) {
    return corrupt("route: {}/frames.csv needs columns frame_id,split,<scores...>", dir);
  }
  FERRY_ASSIGN_OR_RETURN(std::string header_probe, read_file(dir + "/frames.csv"));
  std::vector<std::string> cols;
  {
    std::string line = header_probe.substr(0, header_probe.find('\n'));
    std::size_t p = 0;
    while (true) {
      const std::size_t c = line.find(',', p);
      std::string name = line.substr(p, c == std::string::npos ? std::string::npos : c - p);
      if (!name.empty() && name.back() == '\r') name.pop_back();
      if (name != "frame_id" && name != "split") cols.push_back(name);
      if (c == std::string::npos) break;
      p = c + 1;
    }
  }
  std::unordered_map<int, int> seen;
  for (std::size_t i = 0; i < t.rows(); ++i) {
    FERRY_ASSIGN_OR_RETURN(double fid, t.number(i, "frame_id"));
    if (fid < 0 || fid != static_cast<int>(fid)) {
      return corrupt("route: {}/frames.csv row {}: bad frame_id {}", dir, i + 2, fid);
    }
    if (!seen.emplace(static_cast<int>(fid), 1).second) {
      return corrupt("route: {}/frames.csv: frame {} listed twice", dir, fid);
    }
    r.frames.push_back(static_cast<int>(fid));
    FERRY_ASSIGN_OR_RETURN(std::string sp, t.cell(i, "split"));
    r.split.push_back(sp);
    for (const std::string& c : cols) {
      FERRY_ASSIGN_OR_RETURN(double v, t.number(i, c));
      r.scores[c].push_back(v);
    }
  }
  FERRY_ASSIGN_OR_RETURN(r.gts, load_ground_truth(dir + "/gt.txt"));
  FERRY_ASSIGN_OR_RETURN(r.weak, load_detections(dir + "/weak.txt", Source::kWeak));
  FERRY_ASSIGN_OR_RETURN(r.strong, load_detections(dir + "/strong.txt", Source::kStrong));
  for (const auto& g : r.gts) {
    if (!seen.count(g.frame))
      return corrupt("route: {}/gt.txt: frame {} not in frames.csv", dir, g.frame);
  }
  for (const auto* v : {&r.weak, &r.strong}) {
    for (const auto& d : *v) {
      if (!seen.count(d.frame)) {
        return corrupt("route: {}: detection on frame {} not in frames.csv", dir, d.frame);
      }
    }
  }
  return r;
}

Status save_records(const RecordSet& r, const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return errno_status("mkdir", dir, errno);
  std::string csv = "frame_id,split";
  for (const auto& [c, v] : r.scores) csv += "," + c;
  csv += "\n";
  for (std::size_t i = 0; i < r.frames.size(); ++i) {
    csv += fmt::format("{},{}", r.frames[i], r.split[i]);
    for (const auto& [c, v] : r.scores) csv += fmt::format(",{}", v[i]);
    csv += "\n";
  }
  FERRY_TRY(write_file_atomic(dir + "/frames.csv", csv));
  FERRY_TRY(write_file_atomic(dir + "/gt.txt", format_ground_truth(r.gts)));
  FERRY_TRY(write_file_atomic(dir + "/weak.txt", format_detections(r.weak)));
  return write_file_atomic(dir + "/strong.txt", format_detections(r.strong));
}

}  // namespace ferry::route
