// SPDX-License-Identifier: Apache-2.0
#include "train/stream/activation_policy.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <string>

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

int ActivationPolicy::kept_count() const {
  return static_cast<int>(std::count(keep.begin(), keep.end(), true));
}

int ActivationPolicy::max_recomputed() const {
  int m = 0;
  for (const Span& s : spans()) m = std::max(m, s.end - s.start - 1);
  return m;
}

std::string ActivationPolicy::describe() const {
  std::string letters;
  for (Home h : homes) letters += home_letter(h);
  const std::string k = keep_list(keep);
  return name + " = " + letters + (k.empty() ? "" : " keep " + k);
}

std::string keep_list(const std::vector<bool>& keep) {
  std::string out;
  const int n = static_cast<int>(keep.size());
  for (int l = 0; l < n; ++l) {
    if (!keep[static_cast<std::size_t>(l)]) continue;
    int e = l;  // the run l..e
    while (e + 1 < n && keep[static_cast<std::size_t>(e + 1)]) ++e;
    if (!out.empty()) out += ',';
    out += std::to_string(l);
    if (e > l) out += '-' + std::to_string(e);
    l = e;
  }
  return out;
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
  if (!p.keep.empty() && p.keep.size() != p.homes.size()) {
    return invalid_argument("train: policy {} has {} keep flags for {} layers", p.name,
                            p.keep.size(), p.homes.size());
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

// A whole non-negative decimal integer, or nullopt.
std::optional<int> parse_int(std::string_view s) {
  int v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || v < 0) return std::nullopt;
  return v;
}

// LIST of +keep:LIST (activation_policy.h) for `layers` layers; `spec` names the policy in errors.
Result<std::vector<bool>> parse_keep(std::string_view spec, std::string_view list, int layers) {
  std::vector<bool> keep(static_cast<std::size_t>(layers), false);
  const auto bad = [&] {
    return invalid_argument(
        "train: --policy {}: '{}' is not a keep list (top:N, or layer indices and ranges such as "
        "30,31 or 28-35)",
        spec, list);
  };
  if (list.substr(0, 4) == "top:") {
    const std::optional<int> n = parse_int(list.substr(4));
    if (!n) return bad();
    if (*n < 1 || *n > layers) {
      return invalid_argument(
          "train: --policy {}: keep top:{} outside [1, {}] (the model's layers)", spec, *n, layers);
    }
    for (int l = layers - *n; l < layers; ++l) keep[static_cast<std::size_t>(l)] = true;
    return keep;
  }
  if (list.empty()) return bad();
  std::size_t at = 0;
  while (at <= list.size()) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    const std::string_view item = list.substr(at, comma - at);
    const std::size_t dash = item.find('-');
    const std::optional<int> a = parse_int(item.substr(0, dash));
    const std::optional<int> b =
        dash == std::string_view::npos ? a : parse_int(item.substr(dash + 1));
    if (!a || !b) return bad();
    if (*b < *a) {
      return invalid_argument("train: --policy {}: keep range {} runs backwards", spec, item);
    }
    for (int l = *a; l <= *b; ++l) {
      if (l >= layers) {
        return invalid_argument("train: --policy {}: keep layer {} outside [0, {})", spec, l,
                                layers);
      }
      if (keep[static_cast<std::size_t>(l)]) {
        return invalid_argument("train: --policy {}: keep layer {} listed twice", spec, l);
      }
      keep[static_cast<std::size_t>(l)] = true;
    }
    at = comma + 1;
  }
  return keep;
}

// The boundary homes of one of the spellings before +keep.
Status parse_homes(std::string_view spec, int layers, ActivationPolicy& p) {
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
  return {};
}

}  // namespace

Result<ActivationPolicy> parse_policy(std::string_view spec, int layers) {
  if (layers < 1) return invalid_argument("train: policy for {} layers", layers);
  ActivationPolicy p;
  p.name = std::string(spec);
  // The last "+keep" starts the suffix (an NVMe directory before it may hold '+').
  const std::size_t plus = spec.rfind("+keep");
  const std::string_view homes = spec.substr(0, plus);
  FERRY_TRY(parse_homes(homes, layers, p));
  if (plus != std::string_view::npos) {
    const std::string_view suffix = spec.substr(plus + 5);
    if (suffix.substr(0, 1) != ":") {
      return invalid_argument("train: --policy {}: expected +keep:LIST (top:N or layers)", spec);
    }
    FERRY_ASSIGN_OR_RETURN(p.keep, parse_keep(spec, suffix.substr(1), layers));
  }
  FERRY_TRY(validate(p));
  return p;
}

std::vector<std::string> rejoin_keep_lists(const std::vector<std::string>& items) {
  // "N" or "N-M", digits only.
  const auto is_keep_item = [](std::string_view s) {
    const std::size_t dash = s.find('-');
    const auto digits = [](std::string_view d) {
      return !d.empty() &&
             std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    return dash == std::string_view::npos ? digits(s)
                                          : digits(s.substr(0, dash)) && digits(s.substr(dash + 1));
  };
  std::vector<std::string> out;
  for (const std::string& item : items) {
    if (!out.empty() && is_keep_item(item)) {
      const std::size_t k = out.back().rfind("+keep:");
      if (k != std::string::npos && out.back().compare(k + 6, 4, "top:") != 0) {
        out.back() += ',' + item;
        continue;
      }
    }
    out.push_back(item);
  }
  return out;
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
