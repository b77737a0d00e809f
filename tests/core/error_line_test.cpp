// one_line(): the line of a libtorch error a user is shown (Note
// [TorchScript errors] in session/model_session.cpp). The messages are
// cut from real ones (libtorch 1.13 scripted; PyTorch 2.11 traced).

#include <cstdlib>

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "compat/torch_compat.h"
#include "session/model_session.h"

namespace oomtune {
namespace {

TEST(ErrorLine, APlainErrorKeepsItsFirstLineWithoutTheCxxFrames) {
  EXPECT_EQ(
      one_line("shape '[4, 8]' is invalid for input of size 3 Exception raised from view at aten.cpp:1\nframe #0"),
      "shape '[4, 8]' is invalid for input of size 3");
}

TEST(ErrorLine, AScriptedModelGivesTheCauseAndTheInnermostUserFrame) {
  const std::string message = R"(The following operation failed in the TorchScript interpreter.
Traceback of TorchScript, serialized code (most recent call last):
  File "code/__torch__.py", line 18, in forward
    _0 = (tok_emb).forward(input_ids, )
          ~~~~~~~~~~~~~~~~ <--- HERE
Traceback of TorchScript, original code (most recent call last):
  File "/home/me/train/model.py", line 83, in forward
        x = self.drop(self.tok_emb(input_ids) + self.pos_emb(self.positions[:T]))
                      ~~~~~~~~~~~~ <--- HERE
  File "/home/me/train/layers.py", line 12, in embed
        return F.embedding(
  File "/usr/lib/python3/dist-packages/torch/nn/functional.py", line 2210, in embedding
    return torch.embedding(weight, input, padding_idx, scale_grad_by_freq, sparse)
           ~~~~~~~~~~~~~~~ <--- HERE
RuntimeError: index out of range in self
)";
  EXPECT_EQ(one_line(message), "index out of range in self (at layers.py:12 in embed)");
}

TEST(ErrorLine, ATracedModelListsItsInnermostFrameFirst) {
  const std::string message = R"(The following operation failed in the TorchScript interpreter.
Traceback of TorchScript, serialized code (most recent call last):
  File "code/__torch__/transformers/models/gpt2/modeling_gpt2.py", line 48, in forward
    position_embeds = torch.to((wpe).forward(input, ), dtype=6, layout=0, device=torch.device("cpu"))
                                ~~~~~~~~~~~~ <--- HERE

Traceback of TorchScript, original code (most recent call last):
/opt/venv/lib/python3.12/site-packages/torch/nn/functional.py(2567): embedding
/opt/venv/lib/python3.12/site-packages/torch/nn/modules/sparse.py(189): forward
/opt/venv/lib/python3.12/site-packages/transformers/models/gpt2/modeling_gpt2.py(576): forward
/opt/venv/lib/python3.12/site-packages/transformers/utils/generic.py(939): wrapper
/opt/venv/lib/python3.12/site-packages/torch/jit/_trace.py(1216): trace_module
/home/me/export.py(86): hf
RuntimeError: index out of range in self
)";
  EXPECT_EQ(one_line(message), "index out of range in self (at modeling_gpt2.py:576 in forward)");
}

TEST(ErrorLine, NoUserFrameGivesTheCauseAlone) {
  const std::string message = R"(The following operation failed in the TorchScript interpreter.
Traceback of TorchScript, serialized code (most recent call last):
  File "code/__torch__.py", line 9, in forward
    return torch.mm(x, w)
Traceback of TorchScript, original code (most recent call last):
  File "/usr/lib/python3/dist-packages/torch/nn/functional.py", line 2210, in linear
RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x256 and 16x32)
)";
  EXPECT_EQ(one_line(message), "mat1 and mat2 shapes cannot be multiplied (4x256 and 16x32)");
}

TEST(ErrorLine, AnInterpreterMessageWithoutACauseLineKeepsItsFirstLine) {
  EXPECT_EQ(one_line("The following operation failed in the TorchScript interpreter.\nTraceback of TorchScript"),
            "The following operation failed in the TorchScript interpreter.");
}

// A traced Hugging Face Mixtral with experts_implementation="eager" on the
// meta device (PyTorch 2.11's wording): its experts loop over the ones the
// router picked, found by torch.nonzero.
const char* kMixtralNonzeroOnMeta = R"(The following operation failed in the TorchScript interpreter.
Traceback of TorchScript, serialized code (most recent call last):
  File "code/__torch__/transformers/models/mixtral/modeling_mixtral.py", line 273, in forward
    expert_idx, expert_idx0, expert_idx1, expert_idx2, = torch.unbind(torch.nonzero(_102))
                                                                      ~~~~~~~~~~~~~ <--- HERE

Traceback of TorchScript, original code (most recent call last):
/venv/lib/python3.11/site-packages/transformers/models/mixtral/modeling_mixtral.py(79): forward
/venv/lib/python3.11/site-packages/transformers/integrations/moe.py(634): forward
/venv/lib/python3.11/site-packages/torch/nn/modules/module.py(1769): _slow_forward
/venv/lib/python3.11/site-packages/transformers/models/mixtral/modeling_mixtral.py(128): forward
/venv/lib/python3.11/site-packages/torch/jit/_trace.py(1022): trace
/tmp/export.py(5): <module>
RuntimeError: aten::nonzero: attempted to run this operator with Meta tensors, but there was no fake impl or Meta kernel registered. You may have run into this message while using an operator with PT2 compilation APIs (torch.compile/torch.export); in order to use this operator with those APIs you'll need to add a fake impl. Please see the following for next steps:  https://pytorch.org/tutorials/advanced/custom_ops_landing_page.html

Exception raised from metaFallback at /pytorch/aten/src/ATen/core/MetaFallbackKernel.cpp:12 (most recent call first):
)";

TEST(ErrorLine, AnOperatorWhoseResultSizeDependsOnValuesIsNamedWithTheModelLineOnMeta) {
  EXPECT_EQ(one_line(kMixtralNonzeroOnMeta),
            "aten::nonzero (at modeling_mixtral.py:79 in forward): the size of its result depends on the tensor's "
            "values, which the meta device does not have, so this model cannot run there; probe it on cpu");
}

TEST(ErrorLine, AnOperatorWithoutAMetaKernelIsNamedWithTheModelLine) {
  std::string message = kMixtralNonzeroOnMeta;
  message.replace(message.find("aten::nonzero:"), 13, "aten::histc");
  EXPECT_EQ(one_line(message), fmt::format("aten::histc (at modeling_mixtral.py:79 in forward) has no meta kernel in "
                                           "libtorch {} (nor among oomtune's, probes/meta_kernels.h), so this model "
                                           "cannot run on the meta device; probe it on cpu",
                                           compat::torch_version()));
  // libtorch 1.13's wording, raised outside a TorchScript graph: no line.
  EXPECT_EQ(one_line("Could not run 'aten::_unique2' with arguments from the 'Meta' backend. This could be because"),
            "aten::_unique2: the size of its result depends on the tensor's values, which the meta device does not "
            "have, so this model cannot run there; probe it on cpu");
}

// OOMTUNE_FULL_ERRORS keeps what libtorch said, for finding the kernel or
// autograd node that failed; "0" is off.
TEST(ErrorLine, FullErrorsKeepTheWholeMessageAndTheBacktrace) {
  const std::string message = "expected mat1 and mat2 to have the same dtype\nException raised from addmm\nframe #0";
  const c10::Error error(c10::SourceLocation{"addmm", "Blas.cpp", 1}, "expected mat1 and mat2 to have the same dtype");
  ASSERT_EQ(setenv(kFullErrorsVariable, "0", 1), 0);
  EXPECT_EQ(one_line(message), "expected mat1 and mat2 to have the same dtype");
  EXPECT_EQ(error_text(error), error.what_without_backtrace());
  ASSERT_EQ(setenv(kFullErrorsVariable, "1", 1), 0);
  EXPECT_EQ(one_line(message), message);
  EXPECT_EQ(error_text(error), error.what());
  ASSERT_EQ(unsetenv(kFullErrorsVariable), 0);
  EXPECT_EQ(one_line(message), "expected mat1 and mat2 to have the same dtype");
}

}  // namespace
}  // namespace oomtune
