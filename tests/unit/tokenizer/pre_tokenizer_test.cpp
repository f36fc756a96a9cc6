// SPDX-License-Identifier: Apache-2.0
// Regex pre-split with the Qwen2 / Llama 3 / GPT-2 patterns and the Split behaviors. Expected
// pieces are derived by hand from the patterns (alternatives tried left to right, greedy).
#include <gtest/gtest.h>

#include "model/tokenizer/pre_tokenizer.h"

namespace ferry::model::tok {
namespace {

constexpr std::string_view kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<std::string> split(std::string_view pattern, std::string_view s,
                               SplitBehavior b = SplitBehavior::kIsolated, bool invert = false) {
  auto re = Regex::compile(pattern);
  EXPECT_TRUE(re.ok()) << re.status().to_string();
  std::vector<std::string> out;
  EXPECT_TRUE(split_by_regex(re.value(), b, invert, s, out).ok());
  return out;
}

using V = std::vector<std::string>;

TEST(PreTokenizer, Qwen2PatternSplitsLikeItsDefinition) {
  // "Hello": letters. "  world": \s+(?!\S) backs off to one space, the other space joins the
  // word through [^\r\n\p{L}\p{N}]?. "'s": contraction. " 123": the space is followed by a digit,
  // so only the final \s+ takes it; digits one at a time. "\n\n": \s*[\r\n]+.
  EXPECT_EQ(split(kQwen2, "Hello  world's 123\n\n"),
            (V{"Hello", " ", " world", "'s", " ", "1", "2", "3", "\n\n"}));
  // (?i:...) makes the contraction case-insensitive.
  EXPECT_EQ(split(kQwen2, "HE'S"), (V{"HE", "'S"}));
  // Punctuation run takes trailing newlines: " ?[^\s\p{L}\p{N}]+[\r\n]*".
  EXPECT_EQ(split(kQwen2, "a !!\n\nb"), (V{"a", " !!\n\n", "b"}));
}

TEST(PreTokenizer, Llama3GroupsDigitsByThree) {
  EXPECT_EQ(split(kLlama3, "1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(split(kQwen2, "1234"), (V{"1", "2", "3", "4"}));
}

TEST(PreTokenizer, Gpt2PatternKeepsLeadingSpaceWithWord) {
  EXPECT_EQ(split(kGpt2Pattern, "hello world  x"), (V{"hello", " world", " ", " x"}));
}

TEST(PreTokenizer, UnicodeClassesFollowUcp) {
  // \p{L} covers CJK and accented letters; the space before them joins them.
  EXPECT_EQ(split(kQwen2, "caf\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD"),
            (V{"caf\xC3\xA9", " \xE4\xBD\xA0\xE5\xA5\xBD"}));
}

TEST(PreTokenizer, SplitBehaviors) {
  // Pattern "-" on "a-b--c": pieces a | - | b | - | - | c.
  EXPECT_EQ(split("-", "a-b--c", SplitBehavior::kIsolated), (V{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(split("-", "a-b--c", SplitBehavior::kRemoved), (V{"a", "b", "c"}));
  EXPECT_EQ(split("-", "a-b--c", SplitBehavior::kMergedWithPrevious), (V{"a-", "b-", "-", "c"}));
  EXPECT_EQ(split("-", "a-b--c", SplitBehavior::kMergedWithNext), (V{"a", "-b", "--c"}));
  EXPECT_EQ(split("-", "a-b--c", SplitBehavior::kContiguous), (V{"a", "-", "b", "--", "c"}));
  // invert: the matches are the content, the gaps the delimiters.
  EXPECT_EQ(split("[a-z]+", "ab-cd", SplitBehavior::kRemoved, true), (V{"ab", "cd"}));
}

TEST(PreTokenizer, EmptyMatchesAreSkipped) {
  EXPECT_EQ(split("x*", "abxxc"), (V{"ab", "xx", "c"}));
}

TEST(PreTokenizer, BadRegexIsAnError) {
  const auto re = Regex::compile("(unclosed");
  ASSERT_FALSE(re.ok());
  EXPECT_NE(re.status().message().find("bad regex"), std::string::npos) << re.status().to_string();
}

TEST(PreTokenizer, ByteLevelStepMapsBytesAndAddsPrefixSpace) {
  const Json j =
      Json::parse(R"({"type": "ByteLevel", "add_prefix_space": true, "use_regex": true})");
  auto p = PreTokenizer::from_json(j);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  std::vector<std::string> words;
  ASSERT_TRUE(p->split("hi there\n", words).ok());
  // " hi" -> "Ġhi", " there" -> "Ġthere", "\n" -> "Ċ" (GPT-2 table: 0x20 -> U+0120, 0x0A ->
  // U+010A).
  EXPECT_EQ(words, (V{"\xC4\xA0hi", "\xC4\xA0there", "\xC4\x8A"}));
}

}  // namespace
}  // namespace ferry::model::tok
