#include "gpt_step.h"

#include <utility>

namespace oomtune::bench {
namespace {

using allocsim::alloc_event;
using allocsim::AllocEvent;
using allocsim::free_event;

/// Builds a stream with fresh ids and keeps the order count.
class Stream {
 public:
  std::uint64_t alloc(int64_t bytes, Phase phase) {
    events_.push_back(alloc_event(next_id_, bytes, order_++, phase));
    return next_id_++;
  }
  void free(std::uint64_t id, Phase phase) { events_.push_back(free_event(id, order_++, phase)); }
  std::vector<AllocEvent> take() { return std::move(events_); }

 private:
  std::vector<AllocEvent> events_;
  std::uint64_t next_id_ = 1;
  int64_t order_ = 0;
};

}  // namespace

std::vector<int64_t> gpt_parameter_bytes(const GptShape& s) {
  const int64_t h = s.hidden, f = 4;
  std::vector<int64_t> bytes = {s.vocab * h * f, 1024 * h * f};  // token and position embeddings
  for (int64_t l = 0; l < s.layers; ++l) {
    for (int64_t b : {h * f, h * f, 3 * h * h * f, 3 * h * f, h * h * f, h * f, h * f, h * f, 4 * h * h * f, 4 * h * f,
                      4 * h * h * f, h * f})
      bytes.push_back(b);
  }
  bytes.push_back(h * f);  // final layer norm
  bytes.push_back(h * f);
  return bytes;
}

std::vector<AllocEvent> gpt_step_events(const GptShape& s, int64_t t) {
  const int64_t f = 4, bt = s.batch * t, h = s.hidden;
  const int64_t act = bt * h * f, scores = s.batch * s.heads * t * t * f, logits = bt * s.vocab * f;
  Stream st;
  const std::vector<int64_t> params = gpt_parameter_bytes(s);
  // zero_grad(set_to_none=True): the previous step's gradients go (id 0:
  // made before this step).
  for (std::size_t p = 0; p < params.size(); ++p) st.free(0, Phase::kForward);

  // Per layer, what autograd saves: (id, bytes).
  std::vector<std::vector<std::pair<std::uint64_t, int64_t>>> saved(static_cast<std::size_t>(s.layers));
  std::uint64_t x = st.alloc(act, Phase::kForward);  // embeddings sum
  for (auto& layer : saved) {
    const std::uint64_t ln1 = st.alloc(act, Phase::kForward);
    const std::uint64_t qkv = st.alloc(3 * act, Phase::kForward);
    const std::uint64_t raw = st.alloc(scores, Phase::kForward);  // q·kᵀ, then scaled in place
    const std::uint64_t probs = st.alloc(scores, Phase::kForward);
    st.free(raw, Phase::kForward);
    const std::uint64_t attn = st.alloc(act, Phase::kForward);
    const std::uint64_t proj = st.alloc(act, Phase::kForward);
    const std::uint64_t x1 = st.alloc(act, Phase::kForward);  // residual
    st.free(proj, Phase::kForward);
    const std::uint64_t ln2 = st.alloc(act, Phase::kForward);
    const std::uint64_t fc1 = st.alloc(4 * act, Phase::kForward);
    const std::uint64_t gelu = st.alloc(4 * act, Phase::kForward);
    const std::uint64_t fc2 = st.alloc(act, Phase::kForward);
    const std::uint64_t x2 = st.alloc(act, Phase::kForward);
    st.free(fc2, Phase::kForward);
    layer = {{x, act},  {ln1, act}, {qkv, 3 * act}, {probs, scores}, {attn, act},
             {x1, act}, {ln2, act}, {fc1, 4 * act}, {gelu, 4 * act}};
    x = x2;
  }
  const std::uint64_t lnf = st.alloc(act, Phase::kForward);
  const std::uint64_t logit = st.alloc(logits, Phase::kForward);
  const std::uint64_t logp = st.alloc(logits, Phase::kForward);
  const std::uint64_t loss = st.alloc(4, Phase::kForward);

  // Backward: the head, then the layers in reverse.
  std::vector<std::uint64_t> grads;
  const std::uint64_t glogits = st.alloc(logits, Phase::kBackward);
  st.free(logp, Phase::kBackward);
  st.free(loss, Phase::kBackward);
  grads.push_back(st.alloc(params[0], Phase::kBackward));  // tied lm head / token embedding
  std::uint64_t gx = st.alloc(act, Phase::kBackward);
  st.free(glogits, Phase::kBackward);
  st.free(logit, Phase::kBackward);
  st.free(lnf, Phase::kBackward);
  st.free(x, Phase::kBackward);  // the last block's output, saved by the final layer norm
  std::size_t next_param = params.size() - 1;
  grads.push_back(st.alloc(params[next_param--], Phase::kBackward));
  grads.push_back(st.alloc(params[next_param--], Phase::kBackward));
  for (auto layer = saved.rbegin(); layer != saved.rend(); ++layer) {
    // A gradient temporary the size of each saved tensor.
    for (auto it = layer->rbegin(); it != layer->rend(); ++it) {
      const std::uint64_t tmp = st.alloc(it->second, Phase::kBackward);
      st.free(tmp, Phase::kBackward);
    }
    for (int p = 0; p < 12; ++p) grads.push_back(st.alloc(params[next_param--], Phase::kBackward));
    const std::uint64_t gnext = st.alloc(act, Phase::kBackward);
    st.free(gx, Phase::kBackward);
    gx = gnext;
    for (const auto& [id, bytes] : *layer) st.free(id, Phase::kBackward);
  }
  grads.push_back(st.alloc(params[1], Phase::kBackward));  // position embedding
  st.free(gx, Phase::kBackward);

  // AdamW, one parameter at a time: a temporary of its size.
  for (int64_t bytes : params) {
    const std::uint64_t tmp = st.alloc(bytes, Phase::kOptimizer);
    st.free(tmp, Phase::kOptimizer);
  }
  return st.take();
}

}  // namespace oomtune::bench
