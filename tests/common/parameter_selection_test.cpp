#include "job/parameter_selection.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"

namespace oomtune {
namespace {

// Names as torch.jit.load(f).named_parameters() lists them for the LoRA
// fixture (examples/export_lora_llama.py), one layer's worth.
const std::vector<std::string> kLoraNames = {
    "base_model.model.model.embed_tokens.weight",
    "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight",
    "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight",
    "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight",
    "base_model.model.model.layers.0.mlp.up_proj.weight",
    "base_model.model.lm_head.weight",
};

TEST(GlobMatches, StarsCrossDotsAndMatchTheWholeName) {
  EXPECT_TRUE(glob_matches("*.lora_A.*", kLoraNames[2]));
  EXPECT_FALSE(glob_matches("*.lora_A.*", kLoraNames[3]));
  EXPECT_TRUE(glob_matches("*lm_head.*", kLoraNames[5]));
  EXPECT_FALSE(glob_matches("lm_head.*", kLoraNames[5]));          // anchored at the start
  EXPECT_FALSE(glob_matches("blocks.0", "blocks.0.attn.weight"));  // and at the end
  EXPECT_TRUE(glob_matches("blocks.?.attn.*", "blocks.3.attn.weight"));
  EXPECT_FALSE(glob_matches("blocks.?.attn.*", "blocks.10.attn.weight"));
  EXPECT_TRUE(glob_matches("*", "a"));
  EXPECT_TRUE(glob_matches("a**b", "ab"));
  EXPECT_FALSE(glob_matches("*.LORA_A.*", kLoraNames[2]));  // case sensitive
  EXPECT_TRUE(glob_matches("exact.name", "exact.name"));
  EXPECT_FALSE(glob_matches("", "a"));
}

TEST(FrozenNames, TrainableGlobsFreezeTheRestAndFrozenGlobsFreezeTheirOwn) {
  ParameterSelection trainable{ParameterSelection::Rule::kTrainable, {"*.lora_A.*", "*.lora_B.*"}, false};
  EXPECT_EQ(frozen_names(trainable, kLoraNames, "job.toml", "m.pt"),
            (std::vector<bool>{true, true, false, false, true, true}));
  ParameterSelection frozen{ParameterSelection::Rule::kFrozen, {"*.embed_tokens.*", "*.layers.0.mlp.*"}, false};
  EXPECT_EQ(frozen_names(frozen, kLoraNames, "job.toml", "m.pt"),
            (std::vector<bool>{true, false, false, false, true, false}));
  EXPECT_EQ(frozen_names(ParameterSelection{}, kLoraNames, "job.toml", "m.pt"), std::vector<bool>(6, false));
}

TEST(FrozenNames, AGlobThatMatchesNothingListsTheNearestNames) {
  // The issue's own example: Hugging Face's lm_head sits under PEFT's
  // base_model.model. prefix, so "lm_head.*" matches nothing.
  ParameterSelection selection{ParameterSelection::Rule::kTrainable, {"*.lora_A.*", "lm_head.*"}, false};
  try {
    frozen_names(selection, kLoraNames, "job.toml", "m.pt");
    FAIL() << "no error";
  } catch (const SpecError& e) {
    EXPECT_EQ(std::string(e.what()),
              "job.toml: trainable glob 'lm_head.*' matches no parameter of m.pt (nearest: "
              "base_model.model.lm_head.weight, base_model.model.model.embed_tokens.weight, "
              "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight)");
  }
  selection = {ParameterSelection::Rule::kFrozen, {"*.lora_a.*"}, false};
  try {
    frozen_names(selection, kLoraNames, "job.toml", "m.pt");
    FAIL() << "no error";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("frozen glob '*.lora_a.*' matches no parameter of m.pt (nearest: "
                                         "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight, "),
              std::string::npos)
        << e.what();
  }
}

TEST(NearestNames, OneEditAwayComesFirst) {
  EXPECT_EQ(nearest_names("*.lora_a.*", kLoraNames, 1),
            (std::vector<std::string>{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"}));
  EXPECT_EQ(nearest_names("x", {}, 3), std::vector<std::string>{});
  EXPECT_EQ(nearest_names("b", {"a", "b", "c"}, 5), (std::vector<std::string>{"b", "a", "c"}));
}

}  // namespace
}  // namespace oomtune
