#pragma once
// The allocations of one eager fp32 training step of a GPT (GPT-2 small
// shapes by default), as a function of the sequence length T: a synthetic
// stand-in for what the CPU tracker records, for the variable-length
// benchmark. Per layer, the forward keeps what autograd saves (layer-norm
// outputs, q/k/v, the softmax of the attention scores, B·heads·T², the MLP
// activations) and frees its temporaries (the raw scores, projection
// outputs); the backward makes a gradient temporary per saved tensor, frees
// the layer's saved tensors, and allocates the layer's parameter gradients,
// which live until the next step's zero_grad(set_to_none=True) frees them
// (carried out of the step). The head keeps logits and log-softmax, B·T·V.
// The optimizer (AdamW, one tensor at a time) makes a temporary the size of
// each parameter. Parameters and AdamW state are persistent.

#include <cstdint>
#include <vector>

#include "allocsim/alloc_event.h"

namespace oomtune::bench {

struct GptShape {
  int64_t batch = 8;
  int64_t hidden = 768;
  int64_t heads = 12;
  int64_t layers = 12;
  int64_t vocab = 50257;
};

/// BYTES: parameter tensors of the model (fp32), in creation order.
std::vector<int64_t> gpt_parameter_bytes(const GptShape& shape);

/// One steady step at length `t`; free events with id 0 release the previous
/// step's gradients (carried in), one per parameter.
std::vector<allocsim::AllocEvent> gpt_step_events(const GptShape& shape, int64_t t);

}  // namespace oomtune::bench
