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
