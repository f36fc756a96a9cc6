// SPDX-License-Identifier: Apache-2.0
// Where a generated text first contains one of a request's stop strings, searched only where the
// text changed. The engine detokenizes the whole output after every token (the tokenizer is the
// caller's, and a token may rewrite earlier text: a split UTF-8 character or a merged space), so
// the text grows by a few bytes per token while a search of the whole of it costs its length
// times the number of stop strings: quadratic in the output. The previous text had no match
// (the request would have stopped), so a match in the new text ends after the first byte where
// the two differ; starting each search (stop length - 1) bytes before that byte finds the same
// first match as a search from the start (first_stop_match_whole, the slow twin; tested equal).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace ferry::serve {

// The earliest position in `text` where any non-empty stop string begins, or npos. `previous` is
// the text of the step before, which contained no stop string (empty on the first token).
std::size_t first_stop_match(std::string_view previous, std::string_view text,
                             std::span<const std::string> stops);

// The same by searching all of `text` (the reference).
std::size_t first_stop_match_whole(std::string_view text, std::span<const std::string> stops);

}  // namespace ferry::serve
