// SPDX-License-Identifier: Apache-2.0
// Colour-segmentation detectors and the two estimators for drawn scenes (see scene_detectors.h).
#include "route/scene_detectors.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include <fmt/format.h>
#include <opencv2/imgproc.hpp>

#include "route/scene_images.h"

namespace ferry::route {
namespace {

// Hue ranges (OpenCV: 0-179) of the three drawn class colours: red wraps around 0.
bool hue_is_class(int hue, int cls) {
  switch (cls) {
    case 0:
      return hue <= 10 || hue >= 165;  // red
    case 1:
      return hue >= 45 && hue <= 80;  // green
    default:
      return hue >= 95 && hue <= 125;  // blue
  }
}

// Merges components whose boxes come within `gap` pixels (at the detection scale) into the lower
// label: stats rows are updated in place (area summed, box = union), merged rows get area 0 and
// labels are rewritten so that masks of the merged component cover all its parts. Repeats until
// nothing changes, so chains of parts merge too.
void merge_components(cv::Mat& labels, cv::Mat& stats, int n, double gap) {
  auto rect = [&](int c) {
    return cv::Rect(stats.at<int>(c, cv::CC_STAT_LEFT), stats.at<int>(c, cv::CC_STAT_TOP),
                    stats.at<int>(c, cv::CC_STAT_WIDTH), stats.at<int>(c, cv::CC_STAT_HEIGHT));
  };
  const int g = static_cast<int>(std::ceil(gap));
  std::vector<int> parent(n);
  for (int c = 0; c < n; ++c) parent[c] = c;
  bool changed = true;
  while (changed) {
    changed = false;
    for (int a = 1; a < n; ++a) {
      if (stats.at<int>(a, cv::CC_STAT_AREA) == 0) continue;
      for (int b = a + 1; b < n; ++b) {
        if (stats.at<int>(b, cv::CC_STAT_AREA) == 0) continue;
        const cv::Rect ra = rect(a), rb = rect(b);
        const cv::Rect grown(ra.x - g, ra.y - g, ra.width + 2 * g, ra.height + 2 * g);
        if ((grown & rb).area() == 0) continue;
        const cv::Rect u = ra | rb;
        stats.at<int>(a, cv::CC_STAT_LEFT) = u.x;
        stats.at<int>(a, cv::CC_STAT_TOP) = u.y;
        stats.at<int>(a, cv::CC_STAT_WIDTH) = u.width;
        stats.at<int>(a, cv::CC_STAT_HEIGHT) = u.height;
        stats.at<int>(a, cv::CC_STAT_AREA) += stats.at<int>(b, cv::CC_STAT_AREA);
        stats.at<int>(b, cv::CC_STAT_AREA) = 0;
        parent[b] = a;
        changed = true;
      }
    }
  }
  auto root = [&](int c) {
    while (parent[c] != c) c = parent[c];
    return c;
  };
  for (int y = 0; y < labels.rows; ++y) {
    auto* l = labels.ptr<int>(y);
    for (int x = 0; x < labels.cols; ++x) l[x] = root(l[x]);
  }
}

}  // namespace

ColorDetectorOptions weak_detector_options() {
  ColorDetectorOptions o;
  o.scale = 0.25;
  o.blur_kernel = 1;  // INTER_AREA already averages 4x4 pixels; a blur would grow boxes by 4 px
  o.open_kernel = 0;
  o.min_area = 2;  // 2-px specks stay, as low-confidence candidates (the size term)
  o.min_saturation = 140;
  return o;
}

ColorDetectorOptions strong_detector_options() {
  ColorDetectorOptions o;
  o.scale = 1.0;
  o.blur_kernel = 3;
  o.open_kernel = 0;
  o.min_area = 8;
  o.min_saturation = 80;
  o.merge_gap = 10;
  return o;
}

std::vector<Detection> detect_objects(const cv::Mat& bgr, int frame, Source source,
                                      const ColorDetectorOptions& o) {
  cv::Mat img = bgr;
  if (o.scale != 1.0) cv::resize(bgr, img, cv::Size(), o.scale, o.scale, cv::INTER_AREA);
  if (o.blur_kernel > 1) cv::GaussianBlur(img, img, cv::Size(o.blur_kernel, o.blur_kernel), 0);
  cv::Mat hsv;
  cv::cvtColor(img, hsv, cv::COLOR_BGR2HSV);
  std::vector<Detection> out;
  for (int cls = 0; cls < 3; ++cls) {
    cv::Mat mask(hsv.size(), CV_8U, cv::Scalar(0));
    for (int y = 0; y < hsv.rows; ++y) {
      const auto* p = hsv.ptr<cv::Vec3b>(y);
      auto* m = mask.ptr<unsigned char>(y);
      for (int x = 0; x < hsv.cols; ++x) {
        m[x] =
            (p[x][1] >= o.min_saturation && p[x][2] >= 60 && hue_is_class(p[x][0], cls)) ? 255 : 0;
      }
    }
    if (o.open_kernel > 0) {
      cv::morphologyEx(
          mask, mask, cv::MORPH_OPEN,
          cv::getStructuringElement(cv::MORPH_RECT, cv::Size(o.open_kernel, o.open_kernel)));
    }
    cv::Mat labels, stats, centroids;
    const int n = cv::connectedComponentsWithStats(mask, labels, stats, centroids, 8, CV_32S);
    if (o.merge_gap > 0) merge_components(labels, stats, n, o.merge_gap * o.scale);
    for (int c = 1; c < n; ++c) {
      const int area = stats.at<int>(c, cv::CC_STAT_AREA);
      if (area < o.min_area) continue;
      const int x = stats.at<int>(c, cv::CC_STAT_LEFT), y = stats.at<int>(c, cv::CC_STAT_TOP);
      const int w = stats.at<int>(c, cv::CC_STAT_WIDTH), h = stats.at<int>(c, cv::CC_STAT_HEIGHT);
      // Confidence: mean saturation of the component, its fill of the box and its size, squashed
      // to (0, 1). Small, ragged or washed-out components are the uncertain ones.
      const cv::Rect box(x, y, w, h);
      const cv::Mat own = labels(box) == c;
      const cv::Scalar mean_hsv = cv::mean(hsv(box), own);
      const double fill = static_cast<double>(area) / (w * h);
      const double z = 3.0 * (mean_hsv[1] / 255.0) + 2.0 * fill + 0.8 * std::log(1.0 + area) - 5.0;
      Detection d;
      d.frame = frame;
      d.box = Box{x / o.scale, y / o.scale, w / o.scale, h / o.scale};
      d.score = 1.0 / (1.0 + std::exp(-z));
      d.cls = kSceneClasses[cls];
      d.source = source;
      out.push_back(d);
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Detection& a, const Detection& b) { return a.score > b.score; });
  return out;
}

double skip_estimator_score(const cv::Mat& bgr) {
  cv::Mat half, hsv, gray, lap;
  cv::resize(bgr, half, cv::Size(), 0.5, 0.5, cv::INTER_AREA);
  cv::cvtColor(half, hsv, cv::COLOR_BGR2HSV);
  cv::Mat sat;
  cv::extractChannel(hsv, sat, 1);
  cv::Mat mask = sat >= 90;
  cv::Mat labels, stats, centroids;
  const int n = cv::connectedComponentsWithStats(mask, labels, stats, centroids, 8, CV_32S);
  int small = 0, blobs = 0;
  for (int c = 1; c < n; ++c) {
    const int area = stats.at<int>(c, cv::CC_STAT_AREA);
    if (area < 2) continue;
    ++blobs;
    small += area <= 30;  // ≤ ~11 px objects at full resolution
  }
  cv::cvtColor(half, gray, cv::COLOR_BGR2GRAY);
  cv::Laplacian(gray, lap, CV_32F);
  cv::Scalar mean, stddev;
  cv::meanStdDev(lap, mean, stddev);
  return 0.5 * small + 0.1 * blobs + 0.05 * stddev[0];
}

double cond_estimator_score(const std::vector<Detection>& weak_dets) {
  int low = 0, small = 0;
  for (const Detection& d : weak_dets) {
    low += d.score < 0.6;
    small += d.box.width * d.box.height < 24.0 * 24.0;
  }
  return 0.5 * low + 0.3 * small + 0.1 * static_cast<double>(weak_dets.size());
}

Result<RecordSet> make_scene_records(const SceneRecordOptions& o) {
  if (o.frames <= 0)
    return invalid_argument("scene records: frames must be positive ({})", o.frames);
  if (!(o.calib_fraction > 0 && o.calib_fraction < 1)) {
    return invalid_argument("scene records: calib_fraction must be in (0, 1) ({})",
                            o.calib_fraction);
  }
  if (!o.dump_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.dump_dir, ec);
    if (ec) return io_error("scene records: cannot create {}: {}", o.dump_dir, ec.message());
  }
  RecordSet r;
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> u(0, 1);
  const int n_calib = static_cast<int>(o.frames * o.calib_fraction);
  const ColorDetectorOptions weak = weak_detector_options(), strong = strong_detector_options();
  for (int f = 0; f < o.frames; ++f) {
    const bool calib = f < n_calib;
    const double diff = std::clamp(u(rng) + (calib ? 0.0 : o.test_shift), 0.0, 1.0);
    Scene s = render_scene(f, diff, o.seed);
    if (!o.dump_dir.empty()) {
      FERRY_TRY(write_ppm(s.image, fmt::format("{}/frame_{:06d}.ppm", o.dump_dir, f)));
    }
    std::vector<Detection> w = detect_objects(s.image, f, Source::kWeak, weak);
    std::vector<Detection> st = detect_objects(s.image, f, Source::kStrong, strong);
    r.scores["skip"].push_back(skip_estimator_score(s.image));
    r.scores["cond"].push_back(cond_estimator_score(w));
    r.frames.push_back(f);
    r.split.push_back(calib ? "calib" : "test");
    r.gts.insert(r.gts.end(), s.gts.begin(), s.gts.end());
    r.weak.insert(r.weak.end(), w.begin(), w.end());
    r.strong.insert(r.strong.end(), st.begin(), st.end());
  }
  return r;
}

}  // namespace ferry::route
