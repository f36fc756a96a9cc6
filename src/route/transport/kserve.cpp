// SPDX-License-Identifier: Apache-2.0
// KServe v2 JSON codec for detection requests and responses (see kserve.h). All Json access is
// type-checked first, so nlohmann never throws from here.
#include "route/transport/kserve.h"

#include <cmath>
#include <limits>

namespace ferry::route::kserve {
namespace {

Status bad(std::string_view what) { return invalid_argument("kserve: {}", what); }

// Product of a shape array; error when not an array of non-negative integers.
Result<std::int64_t> shape_product(const Json& t, const std::string& name) {
  if (!t.contains("shape") || !t["shape"].is_array() || t["shape"].empty())
    return invalid_argument("kserve: input '{}' needs a non-empty 'shape' array", name);
  std::int64_t n = 1;
  for (const Json& d : t["shape"]) {
    if (!d.is_number_integer() || d.get<std::int64_t>() < 0)
      return invalid_argument("kserve: input '{}' shape has a non-integer or negative dim", name);
    const std::int64_t v = d.get<std::int64_t>();
    if (v != 0 && n > std::numeric_limits<std::int64_t>::max() / v)
      return invalid_argument("kserve: input '{}' shape overflows", name);
    n *= v;
  }
  return n;
}

// Checks datatype and that data is a flat array with shape-product elements.
Status check_tensor(const Json& t, const std::string& name, const char* dtype) {
  if (!t.contains("datatype") || !t["datatype"].is_string() ||
      t["datatype"].get<std::string>() != dtype) {
    return invalid_argument("kserve: input '{}' must have datatype {}", name, dtype);
  }
  FERRY_ASSIGN_OR_RETURN(std::int64_t n, shape_product(t, name));
  if (!t.contains("data") || !t["data"].is_array())
    return invalid_argument("kserve: input '{}' needs a 'data' array", name);
  if (static_cast<std::int64_t>(t["data"].size()) != n) {
    return invalid_argument("kserve: input '{}' has {} data elements, shape says {}", name,
                            t["data"].size(), n);
  }
  return ok_status();
}

}  // namespace

namespace {

Json request_header(const std::string& id, int frame, const std::string& client,
                    double stream_fps) {
  Json j;
  j["id"] = id;
  Json p = Json::object();
  if (!client.empty()) p["client"] = client;
  if (stream_fps > 0) p["stream_fps"] = stream_fps;
  j["parameters"] = p;
  j["inputs"] = Json::array(
      {{{"name", "frame_id"}, {"shape", {1}}, {"datatype", "INT64"}, {"data", {frame}}}});
  return j;
}

}  // namespace

BinaryRequest encode_frame_request_binary(const std::string& id, int frame, std::size_t image_bytes,
                                          const std::string& client, double stream_fps) {
  Json j = request_header(id, frame, client, stream_fps);
  if (image_bytes > 0) {
    j["inputs"].push_back({{"name", "image"},
                           {"shape", {static_cast<std::int64_t>(image_bytes)}},
                           {"datatype", "UINT8"},
                           {"parameters", {{"binary_data_size", image_bytes}}}});
  }
  BinaryRequest r;
  r.body = j.dump();
  r.header_length = r.body.size();
  r.body.reserve(r.body.size() + image_bytes);
  for (std::size_t i = 0; i < image_bytes; ++i)
    r.body.push_back(static_cast<char>((i * 31 + static_cast<std::size_t>(frame)) & 255));
  return r;
}

std::string encode_frame_request(const std::string& id, int frame, std::size_t image_bytes,
                                 const std::string& client, double stream_fps) {
  Json j = request_header(id, frame, client, stream_fps);
  if (image_bytes > 0) {
    // Deterministic pseudo-pixels; only their size matters to the emulation.
    std::vector<int> px(image_bytes);
    for (std::size_t i = 0; i < image_bytes; ++i) px[i] = static_cast<int>((i * 31 + frame) & 255);
    j["inputs"].push_back({{"name", "image"},
                           {"shape", {static_cast<std::int64_t>(image_bytes)}},
                           {"datatype", "UINT8"},
                           {"data", std::move(px)}});
  }
  return j.dump();
}

Result<FrameRequest> decode_frame_request(std::string_view body, std::int64_t header_length) {
  std::string_view binary;  // tensor bytes after the JSON header (binary extension)
  if (header_length >= 0) {
    if (static_cast<std::uint64_t>(header_length) > body.size())
      return invalid_argument("kserve: {} {} exceeds the body ({} bytes)", kHeaderLengthHeader,
                              header_length, body.size());
    binary = body.substr(static_cast<std::size_t>(header_length));
    body = body.substr(0, static_cast<std::size_t>(header_length));
  }
  FERRY_ASSIGN_OR_RETURN(Json j, parse_json(body, "kserve request"));
  if (!j.is_object()) return bad("request body must be a JSON object");
  FrameRequest r;
  if (j.contains("id")) {
    if (!j["id"].is_string()) return bad("'id' must be a string");
    r.id = j["id"].get<std::string>();
  }
  if (j.contains("parameters")) {
    const Json& p = j["parameters"];
    if (!p.is_object()) return bad("'parameters' must be an object");
    if (p.contains("client")) {
      if (!p["client"].is_string()) return bad("parameters.client must be a string");
      r.client = p["client"].get<std::string>();
    }
    if (p.contains("stream_fps")) {
      if (!p["stream_fps"].is_number()) return bad("parameters.stream_fps must be a number");
      r.stream_fps = p["stream_fps"].get<double>();
      if (!std::isfinite(r.stream_fps) || r.stream_fps < 0 || r.stream_fps > 1e6)
        return bad("parameters.stream_fps out of range [0, 1e6]");
    }
  }
  if (!j.contains("inputs") || !j["inputs"].is_array()) return bad("'inputs' must be an array");
  bool have_frame = false;
  for (const Json& t : j["inputs"]) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string())
      return bad("each input must be an object with a string 'name'");
    const std::string name = t["name"].get<std::string>();
    if (name == "frame_id") {
      FERRY_TRY(check_tensor(t, name, "INT64"));
      if (t["data"].size() != 1 || !t["data"][0].is_number_integer())
        return bad("input 'frame_id' must hold exactly one integer");
      const std::int64_t f = t["data"][0].get<std::int64_t>();
      if (f < 0 || f > std::numeric_limits<int>::max()) return bad("frame_id out of range");
      r.frame = static_cast<int>(f);
      have_frame = true;
    } else if (name == "image" && t.contains("parameters") && t["parameters"].is_object() &&
               t["parameters"].contains("binary_data_size")) {
      if (header_length < 0)
        return invalid_argument(
            "kserve: input 'image' has binary_data_size but the request has no "
            "{} header",
            kHeaderLengthHeader);
      const Json& n = t["parameters"]["binary_data_size"];
      if (!t.contains("datatype") || t["datatype"] != "UINT8")
        return bad("input 'image' must have datatype UINT8");
      if (t.contains("data")) return bad("binary input 'image' must not also carry 'data'");
      FERRY_ASSIGN_OR_RETURN(std::int64_t elems, shape_product(t, name));
      if (!n.is_number_integer() || n.get<std::int64_t>() != elems)
        return invalid_argument(
            "kserve: input 'image' binary_data_size must equal the shape "
            "product {}",
            elems);
      if (static_cast<std::uint64_t>(elems) > kMaxImageBytes)
        return invalid_argument("kserve: input 'image' has {} bytes, limit {}", elems,
                                kMaxImageBytes);
      if (static_cast<std::uint64_t>(elems) != binary.size())
        return invalid_argument(
            "kserve: {} binary bytes after the header, binary_data_size says {}", binary.size(),
            elems);
      r.image_bytes = static_cast<std::size_t>(elems);
      binary = {};
    } else if (name == "image") {
      FERRY_TRY(check_tensor(t, name, "UINT8"));
      if (t["data"].size() > kMaxImageBytes)
        return invalid_argument("kserve: input 'image' has {} bytes, limit {}", t["data"].size(),
                                kMaxImageBytes);
      for (const Json& v : t["data"]) {
        if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > 255)
          return bad("input 'image' holds a value outside UINT8");
      }
      r.image_bytes = t["data"].size();
    } else {
      return invalid_argument("kserve: unknown input '{}' (expected frame_id, image)", name);
    }
  }
  if (!have_frame) return bad("missing input 'frame_id'");
  if (!binary.empty())
    return invalid_argument("kserve: {} bytes after the JSON header belong to no binary input",
                            binary.size());
  return r;
}

std::string encode_detections(const std::string& model, const std::string& id,
                              const std::vector<Detection>& dets) {
  std::vector<double> boxes, scores;
  std::vector<std::string> classes;
  for (const Detection& d : dets) {
    boxes.insert(boxes.end(), {d.box.left, d.box.top, d.box.width, d.box.height});
    scores.push_back(d.score);
    classes.push_back(d.cls);
  }
  const auto k = static_cast<std::int64_t>(dets.size());
  Json j;
  j["id"] = id;
  j["model_name"] = model;
  j["outputs"] = Json::array(
      {{{"name", "boxes"}, {"shape", {k, 4}}, {"datatype", "FP32"}, {"data", boxes}},
       {{"name", "scores"}, {"shape", {k}}, {"datatype", "FP32"}, {"data", scores}},
       {{"name", "classes"}, {"shape", {k}}, {"datatype", "BYTES"}, {"data", classes}}});
  return j.dump();
}

Result<std::vector<Detection>> decode_detections(std::string_view body, const std::string& id,
                                                 int frame) {
  FERRY_ASSIGN_OR_RETURN(Json j, parse_json(body, "kserve response"));
  if (!j.is_object() || !j.contains("outputs") || !j["outputs"].is_array())
    return corrupt("kserve: response lacks an 'outputs' array");
  if (!j.contains("id") || !j["id"].is_string() || j["id"].get<std::string>() != id)
    return corrupt("kserve: response id does not match request id '{}'", id);
  const Json *boxes = nullptr, *scores = nullptr, *classes = nullptr;
  for (const Json& t : j["outputs"]) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string() || !t.contains("data") ||
        !t["data"].is_array()) {
      return corrupt("kserve: malformed output tensor");
    }
    const std::string n = t["name"].get<std::string>();
    if (n == "boxes") boxes = &t["data"];
    if (n == "scores") scores = &t["data"];
    if (n == "classes") classes = &t["data"];
  }
  if (!boxes || !scores || !classes) return corrupt("kserve: response lacks boxes/scores/classes");
  const std::size_t k = scores->size();
  if (boxes->size() != 4 * k || classes->size() != k)
    return corrupt("kserve: response outputs disagree in length");
  std::vector<Detection> dets(k);
  for (std::size_t i = 0; i < k; ++i) {
    double b[4];
    for (int c = 0; c < 4; ++c) {
      const Json& v = (*boxes)[4 * i + c];
      if (!v.is_number()) return corrupt("kserve: non-number in boxes");
      b[c] = v.get<double>();
    }
    if (!(*scores)[i].is_number() || !(*classes)[i].is_string())
      return corrupt("kserve: bad score or class in response");
    dets[i] = Detection{frame,
                        -1,
                        Box{b[0], b[1], b[2], b[3]},
                        (*scores)[i].get<double>(),
                        (*classes)[i].get<std::string>(),
                        Source::kStrong};
  }
  return dets;
}

std::string error_body(std::string_view message) {
  return Json{{"error", std::string(message)}}.dump();
}

}  // namespace ferry::route::kserve
