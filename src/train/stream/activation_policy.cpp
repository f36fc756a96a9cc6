// SPDX-License-Identifier: Apache-2.0
#include "train/stream/activation_policy.h"

#include <algorithm>
#include <charconv>

namespace ferry::train::stream {

char home_letter(Home h) {
  switch (h) {
    case Home::kDevice:
      return 'd';
    case Home::kHost:
      return 'h';
    case Home::kNvme:
      return 'n';
    case Home::kRecompute:
      return 'r';
  }
  return '?';
}

int ActivationPolicy::count(Home h) const {
  return static_cast<int>(std::count(homes.begin(), homes.end(), h));
}

std::vector<Span> ActivationPolicy::spans() const {
  std::vector<Span> out;
  const int L = layers();
  int start = 0;
  for (int i = 1; i <= L; ++i) {
    if (i == L || homes[i] != Home::kRecompute) {
      out.push_back({start, i});
      start = i;
    }
  }
  return out;
}

int ActivationPolicy::max_recomputed() const {
  int m = 0;
  for (const Span& s : spans()) m = std::max(m, s.end - s.start - 1);
  return m;
}

std::string ActivationPolicy::describe() const {
  std::string letters;
  for (Home h : homes) letters += home_letter(h);
  return name + " = " + letters;
}

Status validate(const ActivationPolicy& p) {
  if (p.homes.empty()) return invalid_argument("train: activation policy for 0 layers");
  if (p.homes[0] == Home::kRecompute) {
    return invalid_argument("train: policy {}: boundary 0 (the embedding output) must be kept",
                            p.name);
  }
  if (p.count(Home::kNvme) > 0 && p.nvme_dir.empty()) {
    return invalid_argument("train: policy {} puts boundaries on NVMe but names no directory",
                            p.name);
  }
  return {};
}

namespace {

Result<Home> parse_home_word(std::string_view w, std::string* dir) {
  if (w == "device") return Home::kDevice;
  if (w == "host") return Home::kHost;
  if (w.substr(0, 5) == "nvme:" && w.size() > 5) {
    *dir = std::string(w.substr(5));
    return Home::kNvme;
  }
  return invalid_argument("train: '{}' is not a boundary home (device, host, nvme:DIR)", w);
}

}  // namespace

Result<ActivationPolicy> parse_policy(std::string_view spec, int layers) {
  if (layers < 1) return invalid_argument("train: policy for {} layers", layers);
  ActivationPolicy p;
  p.name = std::string(spec);
  if (spec.substr(0, 6) == "every:") {
    const std::string_view rest = spec.substr(6);
    const std::size_t colon = rest.find(':');
    const std::string_view kstr = rest.substr(0, colon);
    int k = 0;
    const auto [ptr, ec] = std::from_chars(kstr.data(), kstr.data() + kstr.size(), k);
    if (ec != std::errc() || ptr != kstr.data() + kstr.size() || k < 1) {
      return invalid_argument("train: --policy {}: K must be a positive integer", spec);
    }
    Home ckpt = Home::kDevice;
    if (colon != std::string_view::npos) {
      FERRY_ASSIGN_OR_RETURN(ckpt, parse_home_word(rest.substr(colon + 1), &p.nvme_dir));
    }
    for (int i = 0; i < layers; ++i) p.homes.push_back(i % k == 0 ? ckpt : Home::kRecompute);
  } else if (spec.substr(0, 4) == "mix:") {
    const std::string_view rest = spec.substr(4);
    const std::size_t colon = rest.find(':');
    const std::string_view letters = rest.substr(0, colon);
    if (colon != std::string_view::npos) p.nvme_dir = std::string(rest.substr(colon + 1));
    if (static_cast<int>(letters.size()) != layers) {
      return invalid_argument("train: --policy {}: {} letters for {} boundaries", spec,
                              letters.size(), layers);
    }
    for (char c : letters) {
      switch (c) {
        case 'd':
          p.homes.push_back(Home::kDevice);
          break;
        case 'h':
          p.homes.push_back(Home::kHost);
          break;
        case 'n':
          p.homes.push_back(Home::kNvme);
          break;
        case 'r':
          p.homes.push_back(Home::kRecompute);
          break;
        default:
          return invalid_argument("train: --policy {}: '{}' is not one of d, h, n, r", spec, c);
      }
    }
  } else {
    FERRY_ASSIGN_OR_RETURN(const Home h, parse_home_word(spec, &p.nvme_dir));
    p.homes.assign(static_cast<std::size_t>(layers), h);
  }
  FERRY_TRY(validate(p));
  return p;
}

std::vector<int> weight_schedule(const ActivationPolicy& p) {
  std::vector<int> order;
  for (int l = 0; l < p.layers(); ++l) order.push_back(l);
  const std::vector<Span> spans = p.spans();
  for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
    for (int l = it->start; l <= it->end - 2; ++l) order.push_back(l);  // recompute
    for (int l = it->end - 1; l >= it->start; --l) order.push_back(l);  // backward
  }
  return order;
}

}  // namespace ferry::train::stream
