// SPDX-License-Identifier: Apache-2.0
// Detection/ground-truth text I/O and the class-compatibility map (see detection.h).
#include "route/detection.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "core/file_util.h"

namespace ferry::route {

double iou(const Box& a, const Box& b) {
  const double ix0 = std::max(a.left, b.left), iy0 = std::max(a.top, b.top);
  const double ix1 = std::min(a.left + a.width, b.left + b.width);
  const double iy1 = std::min(a.top + a.height, b.top + b.height);
  const double iw = std::max(0.0, ix1 - ix0), ih = std::max(0.0, iy1 - iy0);
  const double inter = iw * ih;
  const double uni = a.width * a.height + b.width * b.height - inter;
  return uni > 0 ? inter / uni : 0.0;
}

void ClassMap::add(std::string det_cls, std::string gt_cls) {
  map_[std::move(det_cls)].insert(std::move(gt_cls));
}

bool ClassMap::compatible(std::string_view det_cls, std::string_view gt_cls) const {
  if (det_cls == gt_cls) return true;
  const auto it = map_.find(det_cls);
  if (it == map_.end()) return false;
  return it->second.find(std::string(gt_cls)) != it->second.end();
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

// Splits text into lines, calling fn(line_no, trimmed_line) for non-empty, non-comment lines.
template <typename Fn>
Status for_each_line(std::string_view text, Fn&& fn) {
  int line_no = 0;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++line_no;
    line = trim(line);
    if (line.empty() || line.front() == '#') continue;
    FERRY_TRY(fn(line_no, line));
  }
  return ok_status();
}

std::vector<std::string_view> split_commas(std::string_view line) {
  std::vector<std::string_view> out;
  while (true) {
    const std::size_t c = line.find(',');
    out.push_back(trim(line.substr(0, c)));
    if (c == std::string_view::npos) break;
    line = line.substr(c + 1);
  }
  return out;
}

bool parse_double(std::string_view s, double& out) {
  if (s.empty()) return false;
  if (s.front() == '+') s.remove_prefix(1);
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && std::isfinite(out);
}

bool parse_int(std::string_view s, int& out) {
  double d = 0;  // the artifact writes ids as "3" or "3.0"
  if (!parse_double(s, d) || d != std::floor(d) || std::fabs(d) > 2e9) return false;
  out = static_cast<int>(d);
  return true;
}

struct Row {
  int frame = 0, obj = -1;
  Box box;
  double score = 0;
  std::string cls;
  bool difficult = false;
};

Status parse_row(std::string_view line, int line_no, std::string_view what, Row& row) {
  const auto f = split_commas(line);
  if (f.size() != 8 && f.size() != 9) {
    return corrupt(
        "route: {} line {}: expected 8 comma-separated fields "
        "(frame_id,obj_id,left,top,width,height,confidence,class), got {}",
        what, line_no, f.size());
  }
  const char* bad = nullptr;
  if (!parse_int(f[0], row.frame) || row.frame < 0)
    bad = "frame_id";
  else if (!parse_int(f[1], row.obj))
    bad = "obj_id";
  else if (!parse_double(f[2], row.box.left))
    bad = "left";
  else if (!parse_double(f[3], row.box.top))
    bad = "top";
  else if (!parse_double(f[4], row.box.width) || row.box.width < 0)
    bad = "width";
  else if (!parse_double(f[5], row.box.height) || row.box.height < 0)
    bad = "height";
  else if (!parse_double(f[6], row.score))
    bad = "confidence";
  else if (f[7].empty())
    bad = "class";
  if (bad != nullptr) {
    return corrupt("route: {} line {}: bad {} in '{}'", what, line_no, bad, line);
  }
  row.cls = std::string(f[7]);
  if (f.size() == 9) {
    if (f[8] != "0" && f[8] != "1") {
      return corrupt("route: {} line {}: difficult flag must be 0 or 1, got '{}'", what, line_no,
                     f[8]);
    }
    row.difficult = f[8] == "1";
  }
  return ok_status();
}

}  // namespace

Result<ClassMap> ClassMap::parse(std::string_view text, std::string_view what) {
  ClassMap m;
  Status s = for_each_line(text, [&](int line_no, std::string_view line) -> Status {
    std::size_t sep = line.find('=');
    if (sep == std::string_view::npos) sep = line.find_first_of(" \t");
    if (sep == std::string_view::npos) {
      return corrupt("route: {} line {}: expected 'det_class gt_class', got '{}'", what, line_no,
                     line);
    }
    const std::string_view a = trim(line.substr(0, sep)), b = trim(line.substr(sep + 1));
    if (a.empty() || b.empty()) {
      return corrupt("route: {} line {}: empty class name in '{}'", what, line_no, line);
    }
    m.add(std::string(a), std::string(b));
    return ok_status();
  });
  if (!s.ok()) return s;
  return m;
}

Result<ClassMap> ClassMap::load(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return parse(text, path);
}

Result<std::vector<Detection>> parse_detections(std::string_view text, std::string_view what,
                                                Source source) {
  std::vector<Detection> out;
  Status s = for_each_line(text, [&](int line_no, std::string_view line) -> Status {
    Row r;
    FERRY_TRY(parse_row(line, line_no, what, r));
    out.push_back(Detection{r.frame, r.obj, r.box, r.score, std::move(r.cls), source});
    return ok_status();
  });
  if (!s.ok()) return s;
  return out;
}

Result<std::vector<GroundTruth>> parse_ground_truth(std::string_view text, std::string_view what) {
  std::vector<GroundTruth> out;
  Status s = for_each_line(text, [&](int line_no, std::string_view line) -> Status {
    Row r;
    FERRY_TRY(parse_row(line, line_no, what, r));
    out.push_back(GroundTruth{r.frame, r.obj, r.box, std::move(r.cls), r.difficult});
    return ok_status();
  });
  if (!s.ok()) return s;
  return out;
}

Result<std::vector<Detection>> load_detections(const std::string& path, Source source) {
  FERRY_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return parse_detections(text, path, source);
}

Result<std::vector<GroundTruth>> load_ground_truth(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return parse_ground_truth(text, path);
}

std::string format_detections(const std::vector<Detection>& dets) {
  std::string out;
  for (const Detection& d : dets) {
    out += fmt::format("{},{},{},{},{},{},{},{}\n", d.frame, d.obj, d.box.left, d.box.top,
                       d.box.width, d.box.height, d.score, d.cls);
  }
  return out;
}

std::string format_ground_truth(const std::vector<GroundTruth>& gts) {
  std::string out;
  for (const GroundTruth& g : gts) {
    out += fmt::format("{},{},{},{},{},{},1,{},{}\n", g.frame, g.obj, g.box.left, g.box.top,
                       g.box.width, g.box.height, g.cls, g.difficult ? 1 : 0);
  }
  return out;
}

}  // namespace ferry::route
