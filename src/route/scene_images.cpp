// SPDX-License-Identifier: Apache-2.0
// Drawn synthetic scenes (see scene_images.h).
#include "route/scene_images.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include <opencv2/imgproc.hpp>

namespace ferry::route {
namespace {

// One RNG stream per frame, independent of how many frames were drawn before it.
std::uint64_t frame_seed(std::uint64_t seed, int frame) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(frame) + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// BGR base colours; saturated so that hue separates the classes from the grey background.
const cv::Vec3i kBase[3] = {{40, 40, 210}, {50, 190, 50}, {210, 90, 30}};

}  // namespace

Scene render_scene(int frame, double difficulty, std::uint64_t seed, const SceneOptions& o) {
  std::mt19937_64 rng(frame_seed(seed, frame));
  std::uniform_real_distribution<double> u(0, 1);
  const double d = std::clamp(difficulty, 0.0, 1.0);
  Scene s;
  // Background: a vertical grey gradient with a few darker grey blobs (texture that is not an
  // object: it has no saturation).
  s.image.create(o.height, o.width, CV_8UC3);
  const double top = 90 + 60 * u(rng), bottom = 120 + 80 * u(rng);
  for (int y = 0; y < o.height; ++y) {
    const auto g = static_cast<unsigned char>(top + (bottom - top) * y / std::max(1, o.height - 1));
    s.image.row(y).setTo(cv::Scalar(g, g, g));
  }
  for (int k = 0; k < 6; ++k) {
    const cv::Point c(static_cast<int>(u(rng) * o.width), static_cast<int>(u(rng) * o.height));
    const int r = 10 + static_cast<int>(u(rng) * 40);
    const double g = 60 + 80 * u(rng);
    cv::circle(s.image, c, r, cv::Scalar(g, g, g), cv::FILLED, cv::LINE_AA);
  }
  const int objects = 1 + static_cast<int>(u(rng) * (2 + 8 * d));
  struct Drawn {
    cv::Rect r;
    int cls;
  };
  std::vector<Drawn> drawn;
  for (int k = 0; k < objects; ++k) {
    const bool small = u(rng) < 0.15 + 0.6 * d;
    const int cls = static_cast<int>(u(rng) * 3) % 3;
    const int w = small ? 5 + static_cast<int>(u(rng) * 6) : 22 + static_cast<int>(u(rng) * 40);
    const int h = small ? 5 + static_cast<int>(u(rng) * 6)
                        : std::max(12, static_cast<int>(w * (0.6 + 0.8 * u(rng))));
    const cv::Rect r(static_cast<int>(u(rng) * (o.width - w)),
                     static_cast<int>(u(rng) * (o.height - h)), w, h);
    cv::Vec3i c = kBase[cls];
    for (int ch = 0; ch < 3; ++ch)
      c[ch] = std::clamp(c[ch] + static_cast<int>(40 * (u(rng) - 0.5)), 0, 255);
    const cv::Scalar col(c[0], c[1], c[2]);
    if (cls == 1) {
      cv::ellipse(s.image, cv::Point(r.x + r.width / 2, r.y + r.height / 2),
                  cv::Size(std::max(1, r.width / 2), std::max(1, r.height / 2)), 0, 0, 360, col,
                  cv::FILLED, cv::LINE_AA);
    } else {
      cv::rectangle(s.image, r, col, cv::FILLED);
    }
    drawn.push_back({r, cls});
    s.small_objects += small;
  }
  // Occluders: grey bars over part of some objects, more and larger with difficulty.
  std::vector<double> covered(drawn.size(), 0.0);
  for (std::size_t k = 0; k < drawn.size(); ++k) {
    if (u(rng) >= 0.6 * d) continue;
    const cv::Rect& r = drawn[k].r;
    const double frac = 0.2 + 0.7 * u(rng);
    const bool vertical = u(rng) < 0.5;
    cv::Rect occ = vertical
                       ? cv::Rect(r.x + static_cast<int>(u(rng) * r.width * (1 - frac)), r.y - 2,
                                  std::max(1, static_cast<int>(r.width * frac)), r.height + 4)
                       : cv::Rect(r.x - 2, r.y + static_cast<int>(u(rng) * r.height * (1 - frac)),
                                  r.width + 4, std::max(1, static_cast<int>(r.height * frac)));
    occ &= cv::Rect(0, 0, o.width, o.height);
    const double g = 70 + 100 * u(rng);
    cv::rectangle(s.image, occ, cv::Scalar(g, g, g), cv::FILLED);
    // Coverage of every object by this occluder (objects drawn earlier may be hit too).
    for (std::size_t j = 0; j < drawn.size(); ++j) {
      const double a = (drawn[j].r & occ).area();
      covered[j] = std::min(1.0, covered[j] + a / std::max(1, drawn[j].r.area()));
    }
  }
  // Sensor noise: per-channel Gaussian, stronger with difficulty.
  cv::Mat noise(s.image.size(), CV_16SC3);
  cv::RNG noise_rng(rng());  // seeded from the frame's stream, not OpenCV's global RNG
  noise_rng.fill(noise, cv::RNG::NORMAL, 0, 4 + 22 * d);
  cv::Mat img16;
  s.image.convertTo(img16, CV_16SC3);
  img16 += noise;
  img16.convertTo(s.image, CV_8UC3);  // saturating
  for (std::size_t k = 0; k < drawn.size(); ++k) {
    const cv::Rect& r = drawn[k].r;
    s.gts.push_back({frame, static_cast<int>(k),
                     Box{static_cast<double>(r.x), static_cast<double>(r.y),
                         static_cast<double>(r.width), static_cast<double>(r.height)},
                     kSceneClasses[drawn[k].cls], covered[k] > 0.7});
  }
  return s;
}

Status write_ppm(const cv::Mat& bgr, const std::string& path) {
  if (bgr.type() != CV_8UC3)
    return invalid_argument("write_ppm: {} is not an 8-bit BGR image", path);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return io_error("write_ppm: cannot open {}", path);
  std::fprintf(f, "P6\n%d %d\n255\n", bgr.cols, bgr.rows);
  std::vector<unsigned char> row(static_cast<std::size_t>(bgr.cols) * 3);
  bool ok = true;
  for (int y = 0; y < bgr.rows && ok; ++y) {
    const auto* p = bgr.ptr<cv::Vec3b>(y);
    for (int x = 0; x < bgr.cols; ++x) {
      row[3 * x] = p[x][2], row[3 * x + 1] = p[x][1], row[3 * x + 2] = p[x][0];
    }
    ok = std::fwrite(row.data(), 1, row.size(), f) == row.size();
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return io_error("write_ppm: short write to {}", path);
  return ok_status();
}

}  // namespace ferry::route
