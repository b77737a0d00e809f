#include "probes/meta_kernels.h"

#include <mutex>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/stack.h>
#include <ATen/ops/add_meta_dispatch.h>
#include <ATen/ops/fill_meta_dispatch.h>
#include <ATen/ops/index_put_native.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include "compat/torch_compat.h"
#include "probes/memory_tracker.h"

namespace oomtune {
namespace {

using Stack = torch::jit::Stack;

// Boxed arguments: the kernels take the stack as the dispatcher passes it,
// which reads the same in libtorch 1.13 and 2.x (SymInt arguments arrive as
// plain ints when they are concrete, as they are in eager mode).
at::Tensor optional_tensor(const c10::IValue& v) { return v.isNone() ? at::Tensor() : v.toTensor(); }

std::vector<int64_t> int_list(const c10::IValue& v) {
  std::vector<int64_t> out;
  for (const c10::IValue& e : v.toListRef()) out.push_back(e.toInt());
  return out;
}

std::vector<bool> bool_list(const c10::IValue& v) {
  std::vector<bool> out;
  for (const c10::IValue& e : v.toListRef()) out.push_back(e.toBool());
  return out;
}

void replace_arguments(Stack* stack, std::size_t count, std::vector<at::Tensor> results) {
  torch::jit::drop(*stack, count);
  for (at::Tensor& r : results) torch::jit::push(*stack, std::move(r));
}

// The dtype of a norm's statistics and parameter gradients: fp32 for a bf16
// or fp16 input with fp32 parameters ("mixed type"), else the input's
// (aten/src/ATen/native/batch_norm.h and layer_norm.cpp, param_scalar_type).
at::ScalarType parameter_dtype(const at::Tensor& input, const at::Tensor& weight) {
  return weight.defined() && weight.scalar_type() != input.scalar_type() ? weight.scalar_type() : input.scalar_type();
}

// embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
// scale_grad_by_freq) -> [num_weights, grad_output.size(-1)] of the
// gradient's dtype (embedding_dense_backward_cpu, Embedding.cpp: at::zeros).
void embedding_dense_backward(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 5);
  const at::Tensor grad = args[0].toTensor();
  const int64_t num_weights = args[2].toInt();
  replace_arguments(stack, 5, {at::empty({num_weights, grad.size(-1)}, grad.options())});
}

// native_layer_norm(input, normalized_shape, weight, bias, eps) -> (Y like
// input, contiguous; mean and rstd of [M] viewed as the input's leading
// dimensions with a 1 for each normalized one), in that order (layer_norm_cpu,
// layer_norm.cpp; layer_norm_cuda makes them in the same order). libtorch's
// meta tensors take the composite math_native_layer_norm, which makes the
// statistics first: the same bytes, but the caching allocator, fed the
// blocks in another order, can place them elsewhere and the predicted
// reserved bytes then differ from a CPU trial's.
void native_layer_norm(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 5);
  const at::Tensor input = args[0].toTensor();
  const std::size_t normalized = args[1].toListRef().size();
  const at::Tensor weight = optional_tensor(args[2]);
  const auto axis = static_cast<std::size_t>(input.dim()) - normalized;
  std::vector<int64_t> stat_shape(input.sizes().begin(), input.sizes().begin() + static_cast<std::ptrdiff_t>(axis));
  const int64_t rows = c10::multiply_integers(stat_shape);
  stat_shape.resize(static_cast<std::size_t>(input.dim()), 1);
  const auto stats = input.options().dtype(parameter_dtype(input, weight));
  at::Tensor y = at::empty_like(input, at::MemoryFormat::Contiguous);
  at::Tensor mean = at::empty({rows}, stats);
  at::Tensor rstd = at::empty({rows}, stats);
  replace_arguments(stack, 5, {y, mean.view(stat_shape), rstd.view(stat_shape)});
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd,
// weight, bias, output_mask) -> (dX like input, contiguous; dgamma like
// weight; dbeta like bias), each only when asked for (layer_norm_backward_cpu,
// layer_norm.cpp).
void native_layer_norm_backward(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 8);
  const at::Tensor input = args[1].toTensor();
  const at::Tensor weight = optional_tensor(args[5]);
  const at::Tensor bias = optional_tensor(args[6]);
  const std::vector<bool> mask = bool_list(args[7]);
  at::Tensor dx, dgamma, dbeta;
  if (mask[0]) dx = at::empty_like(input, at::MemoryFormat::Contiguous);
  if (mask[1] && weight.defined()) dgamma = at::empty_like(weight, at::MemoryFormat::Contiguous);
  if (mask[2] && bias.defined()) dbeta = at::empty_like(bias, at::MemoryFormat::Contiguous);
  replace_arguments(stack, 8, {dx, dgamma, dbeta});
}

// native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW,
// group, output_mask) -> (grad_input in input's suggested memory format,
// grad_weight and grad_bias like weight, contiguous; group_norm.cpp, both
// from the weight, which a group norm without one does not ask for).
// Wav2Vec2's and HuBERT's first feature-extractor convolution.
void native_group_norm_backward(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 10);
  const at::Tensor input = args[1].toTensor();
  const at::Tensor weight = optional_tensor(args[4]);
  const std::vector<bool> mask = bool_list(args[9]);
  at::Tensor dx, dgamma, dbeta;
  if (mask[0]) dx = at::empty_like(input, input.suggest_memory_format());
  if (mask[1] && weight.defined()) dgamma = at::empty_like(weight, at::MemoryFormat::Contiguous);
  if (mask[2] && weight.defined()) dbeta = at::empty_like(weight, at::MemoryFormat::Contiguous);
  replace_arguments(stack, 10, {dx, dgamma, dbeta});
}

// index_select(self, dim, index) -> self's shape with index.numel() at dim
// (index_select_out_cpu_, TensorAdvancedIndexing.cpp).
void index_select(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 3);
  const at::Tensor self = args[0].toTensor();
  const at::Tensor index = args[2].toTensor();
  std::vector<int64_t> shape = self.sizes().vec();
  if (!shape.empty()) shape[c10::maybe_wrap_dim(args[1].toInt(), self.dim())] = index.numel();
  replace_arguments(stack, 3, {at::empty(shape, self.options())});
}

// native_batch_norm(input, weight, bias, running_mean, running_var,
// training, momentum, eps) -> (output like input in its suggested memory
// format; save_mean and save_invstd of [C] when training, [0] otherwise)
// (batch_norm_cpu, Normalization.cpp). Running statistics are updated in
// place: nothing to allocate.
void native_batch_norm(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 8);
  const at::Tensor input = args[0].toTensor();
  const at::Tensor weight = optional_tensor(args[1]);
  const bool training = args[5].toBool();
  const auto stats = input.options().dtype(parameter_dtype(input, weight));
  const int64_t channels = training ? input.size(1) : 0;
  replace_arguments(stack, 8,
                    {at::empty_like(input, input.suggest_memory_format()), at::empty({channels}, stats),
                     at::empty({channels}, stats)});
}

// Whether `t` is dense in one of the layouts batch norm's CPU kernels
// handle directly (Normalization.cpp, is_contiguous).
bool dense_in_a_memory_format(const at::Tensor& t) {
  return t.is_contiguous() || t.is_contiguous(at::MemoryFormat::ChannelsLast) ||
         t.is_contiguous(at::MemoryFormat::ChannelsLast3d);
}

// native_batch_norm_backward(grad_out, input, weight, running_mean,
// running_var, save_mean, save_invstd, train, eps, output_mask) ->
// (grad_input like input in its suggested memory format; grad_weight,
// grad_bias of [C]), each only when asked for (batch_norm_backward_cpu,
// Normalization.cpp). Made in the order a CPU trial counts them: where
// input and grad_out are dense in one memory format, the CPU kernel makes
// grad_input again after the parameters' gradients (its first one is
// kernel scratch), so they come first; the order decides the live bytes at
// each level of backward by gradients made (Note [Backward by gradients]).
void native_batch_norm_backward(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 10);
  const at::Tensor grad_out = args[0].toTensor();
  const at::Tensor input = args[1].toTensor();
  const at::Tensor weight = optional_tensor(args[2]);
  const std::vector<bool> mask = bool_list(args[9]);
  const auto stats = input.options().dtype(parameter_dtype(input, weight));
  const bool input_last = dense_in_a_memory_format(input) && dense_in_a_memory_format(grad_out) &&
                          input.suggest_memory_format() == grad_out.suggest_memory_format();
  at::Tensor grad_input, grad_weight, grad_bias;
  if (mask[0] && !input_last) grad_input = at::empty_like(input, input.suggest_memory_format());
  if (mask[1]) grad_weight = at::empty({input.size(1)}, stats);
  if (mask[2]) grad_bias = at::empty({input.size(1)}, stats);
  if (mask[0] && input_last) grad_input = at::empty_like(input, input.suggest_memory_format());
  replace_arguments(stack, 10, {grad_input, grad_weight, grad_bias});
}

// _adaptive_avg_pool2d(self, output_size) -> [N, C, oh, ow] (or [C, oh, ow])
// in self's suggested memory format (adaptive_avg_pool2d_out_cpu_template,
// AdaptiveAveragePooling.cpp).
void adaptive_avg_pool2d(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 2);
  const at::Tensor self = args[0].toTensor();
  const std::vector<int64_t> size = int_list(args[1]);
  std::vector<int64_t> shape = self.sizes().vec();
  shape[shape.size() - 2] = size[0];
  shape[shape.size() - 1] = size[1];
  replace_arguments(stack, 2, {at::empty(shape, self.options().memory_format(self.suggest_memory_format()))});
}

// _adaptive_avg_pool2d_backward(grad_output, self) -> like self in its
// suggested memory format (adaptive_avg_pool2d_backward_out_cpu_template).
void adaptive_avg_pool2d_backward(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 2);
  const at::Tensor self = args[1].toTensor();
  replace_arguments(stack, 2, {at::empty_like(self, self.suggest_memory_format())});
}

// The spatial output size of a convolution along one dimension
// (aten/src/ATen/native/ConvUtils.h, conv_output_size and
// conv_input_size for transposed convolutions).
int64_t convolution_output_size(int64_t input, int64_t kernel, int64_t stride, int64_t padding, int64_t dilation,
                                int64_t output_padding, bool transposed) {
  if (transposed) return (input - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1;
  return (input + 2 * padding - dilation * (kernel - 1) - 1) / stride + 1;
}

// An argument list of a convolution: one value stands for every spatial
// dimension.
int64_t nth(const std::vector<int64_t>& values, std::size_t i) { return values.size() == 1 ? values[0] : values[i]; }

// The memory format a convolution's CPU and cuDNN kernels work in, and
// return their outputs and gradients in: channels-last when the input or
// the weight suggests it (mkldnn_conv_use_channels_last, ConvUtils.h;
// cudnn_conv_suggest_memory_format the same for cuDNN), else contiguous.
// An input a permute left channels-last (timm's LayerNorm2d) so gets a
// channels-last weight gradient, which AccumulateGrad copies into the
// parameter's strides (its layout contract) where they differ.
at::MemoryFormat convolution_memory_format(const at::Tensor& input, const at::Tensor& weight) {
  if (weight.dim() < 4) return at::MemoryFormat::Contiguous;
  const at::MemoryFormat channels_last =
      weight.dim() == 5 ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::ChannelsLast;
  return input.suggest_memory_format() == channels_last || weight.suggest_memory_format() == channels_last
             ? channels_last
             : at::MemoryFormat::Contiguous;
}

// convolution_overrideable(input, weight, bias, stride, padding, dilation,
// transposed, output_padding, groups) -> [N, C_out, spatial...] in
// convolution_memory_format: where at::convolution sends a device
// without a convolution of its own (ConvBackend::Overrideable,
// Convolution.cpp), which meta is. The output the CPU's convolutions
// (mkldnn_convolution, slow_conv2d) return; the bias is added into it.
void convolution_overrideable(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 9);
  const at::Tensor input = args[0].toTensor();
  const at::Tensor weight = args[1].toTensor();
  const std::vector<int64_t> stride = int_list(args[3]), padding = int_list(args[4]), dilation = int_list(args[5]);
  const bool transposed = args[6].toBool();
  const std::vector<int64_t> output_padding = int_list(args[7]);
  const int64_t groups = args[8].toInt();
  std::vector<int64_t> shape{input.size(0), transposed ? weight.size(1) * groups : weight.size(0)};
  for (int64_t d = 2; d < input.dim(); ++d) {
    const auto i = static_cast<std::size_t>(d - 2);
    shape.push_back(convolution_output_size(input.size(d), weight.size(d), nth(stride, i), nth(padding, i),
                                            nth(dilation, i), output_padding.empty() ? 0 : nth(output_padding, i),
                                            transposed));
  }
  replace_arguments(stack, 9,
                    {at::empty(shape, input.options().memory_format(convolution_memory_format(input, weight)))});
}

// convolution_backward_overrideable(grad_output, input, weight, stride,
// padding, dilation, transposed, output_padding, groups, output_mask) ->
// (grad_input like input, grad_weight like weight, both in
// convolution_memory_format; grad_bias [C_out]), each only when asked for:
// what convolution_backward returns on the CPU.
void convolution_backward_overrideable(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 10);
  const at::Tensor grad_output = args[0].toTensor();
  const at::Tensor input = args[1].toTensor();
  const at::Tensor weight = args[2].toTensor();
  const std::vector<bool> mask = bool_list(args[9]);
  at::Tensor grad_input, grad_weight, grad_bias;
  const at::MemoryFormat format = convolution_memory_format(input, weight);
  if (mask[0]) grad_input = at::empty_like(input, format);
  if (mask[1]) grad_weight = at::empty_like(weight, format);
  if (mask[2]) grad_bias = at::empty({grad_output.size(1)}, grad_output.options());
  replace_arguments(stack, 10, {grad_input, grad_weight, grad_bias});
}

// where.self(condition, self, other) -> the three shapes broadcast, of
// self's and other's promoted dtype (where_self_out through TensorIterator,
// TensorCompare.cpp; a dtype cast or a byte condition's bool copy is the
// CPU kernel's scratch).
void where_self(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 3);
  const at::Tensor condition = args[0].toTensor();
  const at::Tensor self = args[1].toTensor();
  const at::Tensor other = args[2].toTensor();
  const auto shape = at::infer_size(at::infer_size(condition.sizes(), self.sizes()), other.sizes());
  replace_arguments(stack, 3, {at::empty(shape, self.options().dtype(at::result_type(self, other)))});
}

// A binary TensorIterator op's output (BinaryOps.cpp, Activation.cpp): the
// first two arguments' shapes broadcast, of their promoted dtype, in the
// first one's memory format; the op has kArguments arguments in all (the
// rest are scalars). floor_divide(self, other); hardswish_backward(
// grad_output, self), MobileNet-V3's activation; hardtanh_backward(
// grad_output, self, min_val, max_val), ReLU6's (MobileNet-V2). PyTorch runs
// the two backwards on meta through Python decompositions only
// (torch/_decomp/decompositions.py). With kBool, of dtype bool:
// logical_and / _or / _xor(self, other), whose comparison_op (BinaryOps.cpp)
// makes an empty bool tensor that the .out kernel, registered for meta from
// Python only, resizes.
template <std::size_t kArguments, bool kBool = false>
void binary_elementwise(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, kArguments);
  const at::Tensor a = args[0].toTensor();
  const at::Tensor b = args[1].toTensor();
  replace_arguments(
      stack, kArguments,
      {at::empty(
          at::infer_size(a.sizes(), b.sizes()),
          a.options().dtype(kBool ? at::kBool : at::result_type(a, b)).memory_format(a.suggest_memory_format()))});
}

// The in-place logical_and_ / logical_or_ / logical_xor_(self, other)
// write into self and allocate nothing (the out-of-place ones are
// binary_elementwise<2, true>). clamp's backward masks its gradient with
// one ((self >= min).logical_and_(self <= max), FunctionsManual.cpp
// clamp_backward): GPT-OSS's clamped SwiGLU experts.
void logical_binary_(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 2);
  at::Tensor self = args[0].toTensor();
  const at::Tensor other = args[1].toTensor();
  TORCH_CHECK(at::infer_size(self.sizes(), other.sizes()) == self.sizes(),
              "the in-place logical op's result must have self's shape");
  replace_arguments(stack, 2, {self});
}

// native_dropout(input, p, train) -> (output like input, bool mask like
// input), the mask made first (native_dropout_cpu, Dropout.cpp; CUDA's
// dropout_cuda, cuda/Dropout.cu, makes the same two in the same order). What
// oomtune::dropout runs in aten::dropout's place (strategies/dropout_op.h).
// The backward, native_dropout_backward(grad_output, mask, scale), is
// binary_elementwise<3>: grad_output * mask * scale.
void native_dropout(const c10::OperatorHandle&, Stack* stack) {
  const at::Tensor input = torch::jit::last(*stack, 3)[0].toTensor();
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
  at::Tensor output = at::empty_like(input);
  replace_arguments(stack, 3, {output, mask});
}

// roll(self, shifts, dims) -> like self, contiguous (roll_cpu and
// roll_common, TensorTransformations.cpp: rolling several dimensions rolls
// one at a time, the intermediate tensors being the kernel's scratch). Swin
// Transformer's shifted windows.
void roll(const c10::OperatorHandle&, Stack* stack) {
  const at::Tensor self = torch::jit::last(*stack, 3)[0].toTensor();
  replace_arguments(stack, 3, {at::empty_like(self, at::MemoryFormat::Contiguous)});
}

// mse_loss_backward(grad_output, self, target, reduction) -> zeros like
// self, contiguous, filled through the .out kernel (Loss.cpp), which has its
// meta kernel in Python only. oomtune's own mse loss (session/loss.cpp):
// every job with [loss] kind = "mse" (a diffusion UNet's noise target).
void mse_loss_backward(const c10::OperatorHandle&, Stack* stack) {
  const at::Tensor self = torch::jit::last(*stack, 4)[1].toTensor();
  replace_arguments(stack, 4, {at::empty_like(self, at::MemoryFormat::Contiguous)});
}

// relu(self) -> like self (clamp_min(self, 0) through TensorIterator on
// the CPU, Activation.cpp; relu_ and threshold_backward have C++ meta
// kernels of their own).
void relu(const c10::OperatorHandle&, Stack* stack) {
  const at::Tensor self = torch::jit::last(*stack, 1)[0].toTensor();
  replace_arguments(stack, 1, {at::empty_like(self)});
}

// abs(self) -> like self, of the real dtype for a complex one (abs in
// UnaryOps.cpp makes an empty result and fills it through abs.out, which has
// its meta kernel in Python only). T5's relative position buckets
// (transformers' T5Attention._relative_position_bucket).
void abs(const c10::OperatorHandle&, Stack* stack) {
  const at::Tensor self = torch::jit::last(*stack, 1)[0].toTensor();
  replace_arguments(stack, 1, {at::empty_like(self, self.options().dtype(c10::toRealValueType(self.scalar_type())))});
}

// gather_backward(grad, self, dim, index, sparse_grad) -> zeros like self
// of grad's options, filled in place (TensorAdvancedIndexing.cpp). The
// composite kernel scatters out of place for meta tensors, which ATen counts
// as "subclass-like" (ATen/TensorSubclassLikeUtils.h, MetaBit), so a meta
// trial held a second self-sized tensor a CPU or CUDA run does not: this
// kernel makes the one result. DeBERTa's disentangled attention gathers
// [B, H, T, T] scores in every layer.
void gather_backward(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 5);
  const at::Tensor grad = args[0].toTensor();
  const at::Tensor self = args[1].toTensor();
  TORCH_CHECK_NOT_IMPLEMENTED(!args[4].toBool(), "aten::gather_backward with sparse_grad has no meta kernel");
  replace_arguments(stack, 5, {at::empty(self.sizes(), grad.options())});
}

// histc(self, bins, min, max) -> [bins] of self's dtype (histogram_histc_out
// in Histogram.cpp; _histc_cuda in cuda/SummaryOps.cu makes the same). The
// counts are values, which meta has none of: a caller that sizes a tensor
// by them cannot run there, one that only passes them on (the offsets of
// transformers' grouped-matmul experts, integrations/moe.py, whose output
// rows do not depend on the routing) can. Mixtral's and Qwen2-MoE's experts.
void histc(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 4);
  const at::Tensor self = args[0].toTensor();
  const int64_t bins = args[1].toInt();
  replace_arguments(stack, 4, {at::empty({bins}, self.options())});
}

#if OOMTUNE_TORCH_HAS_GROUPED_MM
// _grouped_mm(self, mat2, offs, bias, out_dtype) -> the output that
// create_grouped_gemm_output_tensor makes for the CPU and CUDA kernels alike
// (ATen/native/GroupedMMUtils.h): [S, N] for a 2-D self and 3-D mat2 (the
// experts' case), [G, M, N] when both are 2-D or 3-D, its last dimension
// padded to 16 bytes in the strides (TMA), so the storage is larger than the
// sizes when N is not a multiple of 16 / itemsize. Its CPU path reads the
// offsets' values to slice; the output's shape does not depend on them. The
// backward (GroupedMmBackward0) calls _grouped_mm again.
void grouped_mm(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 5);
  const at::Tensor a = args[0].toTensor();
  const at::Tensor b = args[1].toTensor();
  const at::Tensor offs = optional_tensor(args[2]);
  const at::ScalarType dtype = args[4].isNone() ? a.scalar_type() : args[4].toScalarType();
  const bool a_2d = a.dim() == 2;
  const bool b_2d = b.dim() == 2;
  TORCH_CHECK(offs.defined() == (a_2d || b_2d), "_grouped_mm: offsets are needed exactly when a matrix is 2-D");
  std::vector<int64_t> sizes;
  if (a_2d && b_2d)
    sizes = {offs.size(0), a.size(0), b.size(1)};
  else if (a_2d)
    sizes = {a.size(0), b.size(-1)};
  else if (b_2d)
    sizes = {a.size(1), b.size(1)};
  else
    sizes = {a.size(0), a.size(1), b.size(-1)};
  const int64_t alignment = 16 / static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t padded = (sizes.back() + alignment - 1) / alignment * alignment;
  const std::vector<int64_t> strides =
      sizes.size() == 2 ? std::vector<int64_t>{padded, 1} : std::vector<int64_t>{sizes[1] * padded, padded, 1};
  replace_arguments(stack, 5, {at::empty_strided(sizes, strides, a.options().dtype(dtype))});
}
#endif

// _weight_norm_interface(v, g, dim) -> (w like v, contiguous; norms of g's
// sizes and strides, fp32 for a bf16 g), as weight_norm_cpu makes them
// (WeightNorm.cpp); its backward (grad_w, saved_v, saved_g, saved_norms,
// dim) -> (grad_v like v, grad_g like g), both contiguous
// (weight_norm_backward_cpu). Wav2Vec2's and HuBERT's positional
// convolution (nn.utils.weight_norm, kept by the trace).
void weight_norm_interface(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 3);
  const at::Tensor v = args[0].toTensor();
  const at::Tensor g = args[1].toTensor();
  const at::ScalarType norm_type = g.scalar_type() == at::kBFloat16 ? at::kFloat : g.scalar_type();
  at::Tensor w = at::empty_like(v, at::MemoryFormat::Contiguous);
  at::Tensor norms = at::empty_strided(g.sizes(), g.strides(), g.options().dtype(norm_type));
  replace_arguments(stack, 3, {w, norms});
}

void weight_norm_interface_backward(const c10::OperatorHandle&, Stack* stack) {
  const auto args = torch::jit::last(*stack, 5);
  const at::Tensor v = args[1].toTensor();
  const at::Tensor g = args[2].toTensor();
  replace_arguments(stack, 5,
                    {at::empty_like(v, at::MemoryFormat::Contiguous), at::empty_like(g, at::MemoryFormat::Contiguous)});
}

// equal(self, other) -> false. Meta tensors have no values to compare;
// the one caller that meets them is TorchScript's loader, whose constant
// pooling merges tensor constants that compare equal (a traced model's
// meta constants): false keeps them apart, which costs the bytes of a
// duplicate at most and is what a real comparison of distinct constants
// says. A model that branches on torch.equal cannot run on meta anyway.
void equal(const c10::OperatorHandle&, Stack* stack) {
  torch::jit::drop(*stack, 2);
  torch::jit::push(*stack, false);
}

// Whether the device would add `other` into `sum` in place: autograd sums
// two gradients of one tensor in place into the first when it holds the
// only reference to it and to its storage and its layout is dense; meta
// tensors it never sums in place, taking them for tensor subclasses
// (torch/csrc/autograd/input_buffer.cpp: accumulate, can_accumulate_inplace;
// ATen/TensorSubclassLikeUtils.h counts the meta bit). The gradients of one
// input buffer have one shape (the engine's validate_outputs reduces them
// to the input's).
bool device_sums_in_place(const at::Tensor& sum, const at::Tensor& other) {
  return innermost_call_is("aten::add", kAutogradEngineFrame) && !at::GradMode::is_enabled() &&
         sum.layout() == at::kStrided && other.layout() == at::kStrided && !sum._is_zerotensor() && !sum.is_nested() &&
         sum.is_non_overlapping_and_dense() && sum.use_count() == 1 && sum.has_storage() &&
         sum.storage().use_count() == 1 && sum.sizes().equals(other.sizes());
}

// add.Tensor(self, other, alpha): ATen's meta kernel (at::meta::add, which
// this registration replaces in the dispatcher), but for a sum of two
// gradients that the device adds in place: there `self` is the sum, as
// `old_var.add_(var)` makes it on the CPU and CUDA, and nothing is
// allocated. Out of place, every residual connection's gradient sum made a
// meta trial's backward one gradient higher than the device's (ResNet-18's
// peak by a [micro-batch, 256, 14, 14] fp32 gradient). Unboxed, so that
// `self`'s use count is the caller's, as the engine's check reads it.
at::Tensor add_tensor(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  if (device_sums_in_place(self, other)) return self;
  return at::meta::add(self, other, alpha);
}

// index_put(self, indices, values, accumulate): ATen's composite (a clone
// of self, index_put_ into it), but where IndexBackward0 calls it: indexing's
// backward (index_backward, FunctionsManual.cpp) puts the gradient into
// fresh zeros in place (_index_put_impl_) on the CPU and CUDA, and through
// this out-of-place form for "subclass-like" tensors, meta among them, which
// held two [self] gradients at once where the device holds one (the router
// of a tiny Mixtral: 0.09 MiB more allocated in backward). There the zeros
// are the result here too.
at::Tensor index_put(const at::Tensor& self, const c10::List<c10::optional<at::Tensor>>& indices,
                     const at::Tensor& values, bool accumulate) {
  if (innermost_call_is("aten::index_put", "IndexBackward0")) return self;
  return at::native::index_put(self, indices, values, accumulate);
}

// What the CPU and CUDA kernels check when they take `value` in a tensor's
// dtype (c10::Scalar::to, checked_convert): that it fits, or "value cannot
// be converted to type c10::BFloat16 without overflow". ATen's meta
// kernels convert nothing, so a traced graph's fp32 constant (transformers'
// masks fill with torch.finfo(dtype).min, which a trace records as fp32's)
// passed on meta where the device refuses it under bf16 or fp16 autocast.
void check_value_fits(const at::Scalar& value, at::ScalarType dtype) {
  switch (dtype) {
#define OOMTUNE_CHECK_FITS(type, name) \
  case at::ScalarType::name:           \
    (void)value.to<type>();            \
    break;
    AT_FORALL_SCALAR_TYPES_AND3(Bool, Half, BFloat16, OOMTUNE_CHECK_FITS)
#undef OOMTUNE_CHECK_FITS
    default:
      break;
  }
}

// masked_fill_.Scalar and fill_.Scalar (at::full fills too), which these
// registrations replace: the checks of the CPU kernel (masked_fill_impl_cpu:
// a boolean mask that expands to self) and the value's; nothing allocated.
// fill_ is ATen's meta kernel after the value's check (masked_fill_'s is
// not exported). Unboxed, as ATen's.
at::Tensor& masked_fill_scalar_(at::Tensor& self, const at::Tensor& mask, const at::Scalar& value) {
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_fill_ only supports boolean masks, but got mask with dtype ",
              mask.scalar_type());
  (void)mask.expand(self.sizes());  // expand_inplace's check: a view, no storage
  check_value_fits(value, self.scalar_type());
  return self;
}

at::Tensor& fill_scalar_(at::Tensor& self, const at::Scalar& value) {
  check_value_fits(value, self.scalar_type());
  return at::meta::fill_(self, value);
}

// _amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale):
// GradScaler's unscale, in place; a meta gradient has no values to check or
// divide, so only the checks of 2.11's Python meta registration remain.
void amp_non_finite_check_and_unscale_(const c10::OperatorHandle&, Stack* stack) {
  const at::Tensor found_inf = (*stack)[stack->size() - 2].toTensor();
  const at::Tensor inv_scale = (*stack)[stack->size() - 1].toTensor();
  TORCH_CHECK(found_inf.numel() == 1 && found_inf.is_floating_point(), "found_inf must be a 1-element float tensor");
  TORCH_CHECK(inv_scale.numel() == 1 && inv_scale.is_floating_point(), "inv_scale must be a 1-element float tensor");
  torch::jit::drop(*stack, 3);
}

}  // namespace

void install_meta_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Lives as long as the process: the dispatcher keeps the kernels while
    // their Library does.
    static torch::Library library(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
    library.impl("embedding_dense_backward", torch::CppFunction::makeFromBoxedFunction<&embedding_dense_backward>());
    library.impl("native_layer_norm", torch::CppFunction::makeFromBoxedFunction<&native_layer_norm>());
    library.impl("native_layer_norm_backward",
                 torch::CppFunction::makeFromBoxedFunction<&native_layer_norm_backward>());
    library.impl("native_group_norm_backward",
                 torch::CppFunction::makeFromBoxedFunction<&native_group_norm_backward>());
    library.impl("index_select", torch::CppFunction::makeFromBoxedFunction<&index_select>());
    library.impl("native_batch_norm", torch::CppFunction::makeFromBoxedFunction<&native_batch_norm>());
    library.impl("native_batch_norm_backward",
                 torch::CppFunction::makeFromBoxedFunction<&native_batch_norm_backward>());
    library.impl("_adaptive_avg_pool2d", torch::CppFunction::makeFromBoxedFunction<&adaptive_avg_pool2d>());
    library.impl("_adaptive_avg_pool2d_backward",
                 torch::CppFunction::makeFromBoxedFunction<&adaptive_avg_pool2d_backward>());
    library.impl("where.self", torch::CppFunction::makeFromBoxedFunction<&where_self>());
    library.impl("floor_divide", torch::CppFunction::makeFromBoxedFunction<&binary_elementwise<2>>());
    library.impl("hardswish_backward", torch::CppFunction::makeFromBoxedFunction<&binary_elementwise<2>>());
    library.impl("hardtanh_backward", torch::CppFunction::makeFromBoxedFunction<&binary_elementwise<4>>());
    library.impl("native_dropout", torch::CppFunction::makeFromBoxedFunction<&native_dropout>());
    library.impl("native_dropout_backward", torch::CppFunction::makeFromBoxedFunction<&binary_elementwise<3>>());
    library.impl("roll", torch::CppFunction::makeFromBoxedFunction<&roll>());
    library.impl("mse_loss_backward", torch::CppFunction::makeFromBoxedFunction<&mse_loss_backward>());
    library.impl("relu", torch::CppFunction::makeFromBoxedFunction<&relu>());
    library.impl("equal", torch::CppFunction::makeFromBoxedFunction<&equal>());
    library.impl("abs", torch::CppFunction::makeFromBoxedFunction<&abs>());
    library.impl("add.Tensor", TORCH_FN(add_tensor));
    library.impl("index_put", TORCH_FN(index_put));
    library.impl("masked_fill_.Scalar", TORCH_FN(masked_fill_scalar_));
    library.impl("fill_.Scalar", TORCH_FN(fill_scalar_));
    library.impl("gather_backward", torch::CppFunction::makeFromBoxedFunction<&gather_backward>());
    library.impl("_amp_foreach_non_finite_check_and_unscale_",
                 torch::CppFunction::makeFromBoxedFunction<&amp_non_finite_check_and_unscale_>());
#if OOMTUNE_TORCH_HAS_GROUPED_MM
    library.impl("_grouped_mm", torch::CppFunction::makeFromBoxedFunction<&grouped_mm>());
#endif
    for (const char* op : {"logical_and", "logical_or", "logical_xor"})
      library.impl(op, torch::CppFunction::makeFromBoxedFunction<&binary_elementwise<2, true>>());
    for (const char* op : {"logical_and_", "logical_or_", "logical_xor_"})
      library.impl(op, torch::CppFunction::makeFromBoxedFunction<&logical_binary_>());
    library.impl("histc", torch::CppFunction::makeFromBoxedFunction<&histc>());
    library.impl("_weight_norm_interface", torch::CppFunction::makeFromBoxedFunction<&weight_norm_interface>());
    library.impl("_weight_norm_interface_backward",
                 torch::CppFunction::makeFromBoxedFunction<&weight_norm_interface_backward>());
    library.impl("convolution_overrideable", torch::CppFunction::makeFromBoxedFunction<&convolution_overrideable>());
    library.impl("convolution_backward_overrideable",
                 torch::CppFunction::makeFromBoxedFunction<&convolution_backward_overrideable>());
  });
}

}  // namespace oomtune
