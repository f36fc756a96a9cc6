// SPDX-License-Identifier: Apache-2.0
// The stop-string search over what changed (serve/stop_strings.h) against the search of the
// whole text, on random token streams over a small alphabet (so stop strings occur often), with a
// detokenizer that sometimes rewrites earlier text, as a split UTF-8 character or a merged space
// does, and with stop strings that straddle the old and the new text.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "serve/stop_strings.h"

namespace ferry::serve {
namespace {

TEST(StopStrings, TailSearchFindsTheWholeSearchsFirstMatch) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> letter(0, 2);  // "abc"
  int matches = 0, rewrites = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::string> stops;
    const int n_stops = 1 + int(rng() % 3);
    for (int i = 0; i < n_stops; ++i) {
      std::string s(1 + rng() % 4, 'a');
      for (char& c : s) c = char('a' + letter(rng));
      stops.push_back(s);
    }
    if (rng() % 5 == 0) stops.push_back("");  // ignored, as the engine does
    std::string previous;
    for (int step = 0; step < 40; ++step) {
      std::string text = previous;
      if (!text.empty() && rng() % 6 == 0) {  // a token rewrites a byte of earlier text
        text[rng() % text.size()] = char('a' + letter(rng));
        ++rewrites;
      }
      if (!text.empty() && rng() % 10 == 0) text.pop_back();  // or takes one back
      const int grow = int(rng() % 3);
      for (int i = 0; i < grow; ++i) text.push_back(char('a' + letter(rng)));
      // The engine searches only texts whose predecessor held no stop string: a rewrite may put
      // one into the old part, which the tail search must find too.
      const std::size_t whole = first_stop_match_whole(text, stops);
      ASSERT_EQ(first_stop_match(previous, text, stops), whole)
          << "trial " << trial << " step " << step << " previous '" << previous << "' text '"
          << text << "'";
      if (whole != std::string::npos) {
        ++matches;
        break;
      }
      previous = text;
    }
  }
  EXPECT_GT(matches, 1000) << "the random streams rarely hit a stop string";
  EXPECT_GT(rewrites, 1000);
}

TEST(StopStrings, MatchAcrossTheOldAndNewText) {
  const std::vector<std::string> stops = {"END", "xyz"};
  EXPECT_EQ(first_stop_match("hello E", "hello END", stops), 6u);
  EXPECT_EQ(first_stop_match("hello EN", "hello END!", stops), 6u);
  EXPECT_EQ(first_stop_match("xy", "xyz", stops), 0u);
  EXPECT_EQ(first_stop_match("abc", "abc", stops), std::string::npos);
  EXPECT_EQ(first_stop_match("abcxyz?", "abc", stops), std::string::npos);  // a prefix: no news
  EXPECT_EQ(first_stop_match("", "", stops), std::string::npos);
  EXPECT_EQ(first_stop_match("", "xyzEND", stops), 0u);
  // A rewrite in front of the new bytes: the first match is the earlier one.
  EXPECT_EQ(first_stop_match("aENx xy", "aEND xyz", stops), 1u);
}

}  // namespace
}  // namespace ferry::serve
