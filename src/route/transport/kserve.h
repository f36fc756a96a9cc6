// SPDX-License-Identifier: Apache-2.0
// The wire protocol between the route edge agent and cloud server: KServe v2 / Triton-style JSON
// over HTTP (docs/route_system.md). This file is the codec only (no sockets):
//   request  {"id", "parameters"?: {"client", "stream_fps"},
//             "inputs": [{"name":"frame_id","shape":[1],"datatype":"INT64","data":[f]},
//                        {"name":"image","shape":[...],"datatype":"UINT8","data":[...]}?]}
//   response {"id", "model_name", "outputs": [
//               {"name":"boxes","shape":[K,4],"datatype":"FP32","data":[l,t,w,h,...]},
//               {"name":"scores","shape":[K],"datatype":"FP32","data":[...]},
//               {"name":"classes","shape":[K],"datatype":"BYTES","data":["cls",...]}]}
//   error    {"error": "<message>"}
// Binary tensor extension (KServe v2 / Triton "binary_data"): the body is a JSON header of
// `Inference-Header-Content-Length` bytes followed by the raw tensor bytes in input order; a
// binary input has "parameters": {"binary_data_size": n} and no "data". The agent sends the image
// this way (1 byte per pixel on the wire instead of ~3.6 as JSON numbers); JSON stays accepted.
// Every decode validates names, datatypes, shapes (product of shape == number of data elements)
// and value ranges and returns kInvalidArgument on anything malformed; it never throws.
// Covered by tests/unit/route/transport_kserve_test.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/json.h"
#include "core/result.h"
#include "route/detection.h"

namespace ferry::route::kserve {

inline constexpr std::size_t kMaxImageBytes = 16u << 20;  // 16 MiB of emulated pixels

// A decoded detection request (what the server needs of it).
struct FrameRequest {
  std::string id;
  int frame = 0;
  std::size_t image_bytes = 0;  // elements of the optional UINT8 "image" input
  std::string client;           // parameters.client ("" when absent)
  double stream_fps = 0;        // parameters.stream_fps (0 when absent): the client's frame rate
};

// Builds the request body; `image_bytes` pseudo-pixels emulate the upload size.
std::string encode_frame_request(const std::string& id, int frame, std::size_t image_bytes,
                                 const std::string& client, double stream_fps);
// Decodes a JSON request, or with `header_length` >= 0 (the Inference-Header-Content-Length
// header) a binary one: body[0, header_length) is the JSON header, the rest the tensor bytes.
Result<FrameRequest> decode_frame_request(std::string_view body, std::int64_t header_length = -1);

struct BinaryRequest {
  std::string body;               // JSON header + raw image bytes
  std::size_t header_length = 0;  // send as Inference-Header-Content-Length
};
// The binary-extension form of encode_frame_request (same pseudo-pixels).
BinaryRequest encode_frame_request_binary(const std::string& id, int frame, std::size_t image_bytes,
                                          const std::string& client, double stream_fps);
inline constexpr const char* kHeaderLengthHeader = "Inference-Header-Content-Length";

std::string encode_detections(const std::string& model, const std::string& id,
                              const std::vector<Detection>& dets);
// Decodes a response into strong detections of `frame` (Source::kStrong); checks the id matches.
Result<std::vector<Detection>> decode_detections(std::string_view body, const std::string& id,
                                                 int frame);

std::string error_body(std::string_view message);

}  // namespace ferry::route::kserve
