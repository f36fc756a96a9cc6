// SPDX-License-Identifier: Apache-2.0
// KServe v2 codec (src/route/transport/kserve.h) and URL parsing: round trips and rejections.
#include "route/transport/kserve.h"

#include <gtest/gtest.h>

#include "route/transport/http_client.h"

namespace ferry::route {
namespace {

TEST(RouteKserve, FrameRequestRoundTrip) {
  const std::string body = kserve::encode_frame_request("id-1", 42, 10, "edge", 30);
  auto r = kserve::decode_frame_request(body);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->id, "id-1");
  EXPECT_EQ(r->frame, 42);
  EXPECT_EQ(r->image_bytes, 10u);
  EXPECT_EQ(r->client, "edge");
  EXPECT_DOUBLE_EQ(r->stream_fps, 30);
}

TEST(RouteKserve, BinaryFrameRequestRoundTripAndSize) {
  const std::size_t px = 16 * 1024;
  kserve::BinaryRequest b = kserve::encode_frame_request_binary("id-2", 7, px, "edge", 20);
  ASSERT_EQ(b.body.size(), b.header_length + px);  // 1 byte per pixel after the JSON header
  EXPECT_EQ(b.body[0], '{');
  EXPECT_EQ(b.body[b.header_length - 1], '}');
  EXPECT_EQ(static_cast<unsigned char>(b.body[b.header_length + 1]), (1 * 31 + 7) & 255);
  auto r = kserve::decode_frame_request(b.body, static_cast<std::int64_t>(b.header_length));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->id, "id-2");
  EXPECT_EQ(r->frame, 7);
  EXPECT_EQ(r->image_bytes, px);
  EXPECT_EQ(r->client, "edge");
  // The same request as JSON numbers is ~3.6x the bytes.
  const std::size_t json = kserve::encode_frame_request("id-2", 7, px, "edge", 20).size();
  EXPECT_GT(json, 3 * b.body.size());
  // A request without an image needs no binary part.
  kserve::BinaryRequest none = kserve::encode_frame_request_binary("n", 1, 0, "", 0);
  EXPECT_EQ(none.body.size(), none.header_length);
  EXPECT_TRUE(
      kserve::decode_frame_request(none.body, static_cast<std::int64_t>(none.header_length)).ok());
}

TEST(RouteKserve, RejectsMalformedBinaryRequests) {
  kserve::BinaryRequest b = kserve::encode_frame_request_binary("id", 3, 100, "", 0);
  const auto h = static_cast<std::int64_t>(b.header_length);
  EXPECT_FALSE(kserve::decode_frame_request(b.body).ok());         // binary input, no header length
  EXPECT_FALSE(kserve::decode_frame_request(b.body, h - 1).ok());  // header cut inside the JSON
  EXPECT_FALSE(kserve::decode_frame_request(b.body, h + 1).ok());  // one pixel short
  EXPECT_FALSE(kserve::decode_frame_request(b.body + "x", h).ok());  // a byte too many
  EXPECT_FALSE(
      kserve::decode_frame_request(b.body, static_cast<std::int64_t>(b.body.size()) + 1).ok());
  // binary_data_size disagreeing with the shape, or data given as well.
  const std::string lie =
      R"({"id":"l","inputs":[{"name":"frame_id","shape":[1],"datatype":"INT64",)"
      R"("data":[1]},{"name":"image","shape":[4],"datatype":"UINT8",)"
      R"("parameters":{"binary_data_size":3}}]})";
  EXPECT_FALSE(
      kserve::decode_frame_request(lie + "abc", static_cast<std::int64_t>(lie.size())).ok());
  const std::string both =
      R"({"id":"b","inputs":[{"name":"frame_id","shape":[1],"datatype":"INT64",)"
      R"("data":[1]},{"name":"image","shape":[2],"datatype":"UINT8","data":[1,2],)"
      R"("parameters":{"binary_data_size":2}}]})";
  EXPECT_FALSE(
      kserve::decode_frame_request(both + "ab", static_cast<std::int64_t>(both.size())).ok());
  // Trailing bytes with no binary input to own them.
  const std::string plain = kserve::encode_frame_request("p", 1, 0, "", 0);
  EXPECT_FALSE(
      kserve::decode_frame_request(plain + "zz", static_cast<std::int64_t>(plain.size())).ok());
  EXPECT_TRUE(kserve::decode_frame_request(plain, static_cast<std::int64_t>(plain.size())).ok());
}

TEST(RouteKserve, DetectionsRoundTripAndIdCheck) {
  std::vector<Detection> d = {{4, -1, Box{1.5, 2, 3, 4.25}, 0.875, "car", Source::kStrong},
                              {4, -1, Box{0, 0, 10, 10}, 0.1, "person", Source::kStrong}};
  const std::string body = kserve::encode_detections("strong", "x", d);
  auto got = kserve::decode_detections(body, "x", 4);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_DOUBLE_EQ((*got)[0].box.height, 4.25);
  EXPECT_DOUBLE_EQ((*got)[1].score, 0.1);
  EXPECT_EQ((*got)[1].cls, "person");
  EXPECT_EQ((*got)[0].source, Source::kStrong);
  EXPECT_FALSE(kserve::decode_detections(body, "y", 4).ok());  // wrong id
  auto empty = kserve::decode_detections(kserve::encode_detections("s", "e", {}), "e", 1);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(RouteKserve, RejectsMalformedResponses) {
  for (
      const char* b :
      {"", "{}", R"({"id":"x","outputs":[]})",
       R"({"id":"x","outputs":[{"name":"boxes","data":[1,2,3]},{"name":"scores","data":[1]},{"name":"classes","data":["a"]}]})",
       R"({"id":"x","outputs":[{"name":"boxes","data":[1,2,3,"a"]},{"name":"scores","data":[1]},{"name":"classes","data":["a"]}]})"}) {
    EXPECT_FALSE(kserve::decode_detections(b, "x", 0).ok()) << b;
  }
}

TEST(RouteKserve, ErrorBodyIsJson) {
  EXPECT_EQ(kserve::error_body("bad \"thing\""), R"({"error":"bad \"thing\""})");
}

TEST(RouteHttpUrl, Parses) {
  auto a = parse_http_url("http://10.0.0.2:8000/");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "10.0.0.2");
  EXPECT_EQ(a->port, 8000);
  ASSERT_TRUE(parse_http_url("localhost:1").ok());
  for (const char* bad : {"https://a:1", "http://a", "http://a:0", "http://a:70000", "a:b",
                          "http://a:1/path", ":80"}) {
    EXPECT_FALSE(parse_http_url(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace ferry::route
