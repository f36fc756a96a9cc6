// SPDX-License-Identifier: Apache-2.0
#include "train/greedy_eval.h"

#include <algorithm>
#include <map>

namespace ferry::train {

namespace {

struct Seq {
  std::vector<std::int32_t> ids;  // prompt + generated so far
  std::size_t prompt_len = 0;
  bool done = false;
};

// Runs one packed forward over `seqs` (the unfinished ones) and appends each one's argmax.
Status decode_round(model::ModelCompute& compute, const model::ModelParams& params,
                    std::vector<Seq*>& live, std::int32_t im_end, int max_new,
                    std::vector<float>& logits, std::vector<std::int32_t>& ids,
                    std::vector<std::int32_t>& pos, std::vector<std::int32_t>& cu) {
  ids.clear();
  pos.clear();
  cu.assign(1, 0);
  for (Seq* s : live) {
    for (std::size_t t = 0; t < s->ids.size(); ++t) {
      ids.push_back(s->ids[t]);
      pos.push_back(static_cast<std::int32_t>(t));
    }
    cu.push_back(static_cast<std::int32_t>(ids.size()));
  }
  const std::int64_t T = static_cast<std::int64_t>(ids.size());
  const std::int64_t V = compute.geometry().vocab;
  logits.resize(static_cast<std::size_t>(T * V));
  const model::PackedBatch batch{
      .ids = ConstTensorView::contiguous(ids.data(), DType::kI32, Device::kCpu, {T}),
      .positions = ConstTensorView::contiguous(pos.data(), DType::kI32, Device::kCpu, {T}),
      .cu_seqlens = ConstTensorView::contiguous(cu.data(), DType::kI32, Device::kCpu,
                                                {static_cast<std::int64_t>(cu.size())}),
      .targets = {}};
  FERRY_ASSIGN_OR_RETURN(
      const model::ForwardResult r,
      compute.forward(params, batch, {},
                      TensorView::contiguous(logits.data(), DType::kF32, Device::kCpu, {T, V})));
  (void)r;
  for (std::size_t i = 0; i < live.size(); ++i) {
    const float* row = logits.data() + static_cast<std::size_t>(cu[i + 1] - 1) * V;
    const auto best = static_cast<std::int32_t>(std::max_element(row, row + V) - row);
    Seq* s = live[i];
    s->ids.push_back(best);
    if (best == im_end || s->ids.size() - s->prompt_len >= static_cast<std::size_t>(max_new)) {
      s->done = true;
    }
  }
  return {};
}

}  // namespace

Result<EvalResult> evaluate(model::ModelCompute& compute, const model::ModelParams& params,
                            const model::Tokenizer& tok, const std::vector<TokenizedExample>& eval,
                            std::int64_t max_tokens, int max_new_tokens) {
  EvalResult res;
  const std::int32_t im_end = tok.token_to_id("<|im_end|>");
  const std::int64_t V = compute.geometry().vocab;
  // Cap the [T, V] logits buffer at 64 Mi floats (256 MiB).
  const std::int64_t logit_tokens = std::max<std::int64_t>(
      1,
      std::min<std::int64_t>(max_tokens, (std::int64_t(64) << 20) / std::max<std::int64_t>(V, 1)));
  std::vector<float> logits;
  std::vector<std::int32_t> ids, pos, cu, tgt;
  double loss_sum = 0.0;
  std::int64_t counted = 0;

  // Loss: pack whole examples.
  std::size_t i = 0;
  while (i < eval.size()) {
    ids.clear();
    pos.clear();
    tgt.clear();
    cu.assign(1, 0);
    while (i < eval.size() && std::int64_t(ids.size() + eval[i].ids.size()) <= max_tokens) {
      for (std::size_t t = 0; t < eval[i].ids.size(); ++t) {
        ids.push_back(eval[i].ids[t]);
        pos.push_back(static_cast<std::int32_t>(t));
        tgt.push_back(eval[i].targets[t]);
      }
      cu.push_back(static_cast<std::int32_t>(ids.size()));
      ++i;
    }
    if (cu.size() == 1) {
      return invalid_argument("train: eval example of {} tokens exceeds {} tokens",
                              eval[i].ids.size(), max_tokens);
    }
    const std::int64_t T = static_cast<std::int64_t>(ids.size());
    const model::PackedBatch batch{
        .ids = ConstTensorView::contiguous(ids.data(), DType::kI32, Device::kCpu, {T}),
        .positions = ConstTensorView::contiguous(pos.data(), DType::kI32, Device::kCpu, {T}),
        .cu_seqlens = ConstTensorView::contiguous(cu.data(), DType::kI32, Device::kCpu,
                                                  {static_cast<std::int64_t>(cu.size())}),
        .targets = ConstTensorView::contiguous(tgt.data(), DType::kI32, Device::kCpu, {T})};
    FERRY_ASSIGN_OR_RETURN(const model::ForwardResult r, compute.forward(params, batch));
    loss_sum += r.loss_sum;
    counted += r.counted;
  }
  res.loss = counted > 0 ? loss_sum / double(counted) : 0.0;

  // Exact match: groups whose final length (prompt + max_new) fits the logits budget.
  std::vector<Seq> seqs(eval.size());
  for (std::size_t k = 0; k < eval.size(); ++k) {
    seqs[k].prompt_len = static_cast<std::size_t>(eval[k].prompt_len);
    seqs[k].ids.assign(eval[k].ids.begin(), eval[k].ids.begin() + eval[k].prompt_len);
  }
  std::size_t g0 = 0;
  while (g0 < seqs.size()) {
    std::size_t g1 = g0;
    std::int64_t budget = 0;
    while (g1 < seqs.size()) {
      const std::int64_t need = std::int64_t(seqs[g1].prompt_len) + max_new_tokens;
      if (g1 > g0 && budget + need > logit_tokens) break;
      budget += need;
      ++g1;
    }
    if (budget > max_tokens) {
      return invalid_argument("train: eval prompt of {} tokens + {} new tokens exceeds {} tokens",
                              seqs[g0].prompt_len, max_new_tokens, max_tokens);
    }
    std::vector<Seq*> live;
    for (;;) {
      live.clear();
      for (std::size_t k = g0; k < g1; ++k) {
        if (!seqs[k].done) live.push_back(&seqs[k]);
      }
      if (live.empty()) break;
      FERRY_TRY(decode_round(compute, params, live, im_end, max_new_tokens, logits, ids, pos, cu));
    }
    g0 = g1;
  }
  for (std::size_t k = 0; k < seqs.size(); ++k) {
    const Seq& s = seqs[k];
    const bool ended = s.ids.back() == im_end;
    if (!ended) continue;
    const std::span<const std::int32_t> gen(s.ids.data() + s.prompt_len,
                                            s.ids.size() - s.prompt_len - 1);
    auto text = tok.decode(gen);  // ids past the tokenizer's vocabulary: simply wrong
    res.correct += text.ok() && *text == eval[k].answer;
  }
  res.total = static_cast<std::int64_t>(eval.size());
  return res;
}

double majority_baseline(const std::vector<TokenizedExample>& train,
                         const std::vector<TokenizedExample>& eval) {
  if (train.empty() || eval.empty()) return 0.0;
  std::map<std::string, std::int64_t> counts;
  for (const TokenizedExample& ex : train) ++counts[ex.answer];
  const auto best =
      std::max_element(counts.begin(), counts.end(),
                       [](const auto& a, const auto& b) { return a.second < b.second; });
  std::int64_t hits = 0;
  for (const TokenizedExample& ex : eval) hits += ex.answer == best->first;
  return double(hits) / double(eval.size());
}

}  // namespace ferry::train
