#include "recipes/strategy_recipes.h"

namespace oomtune {

const std::array<StrategyRecipe, kNumStrategies>& strategy_recipes() {
  static const std::array<StrategyRecipe, kNumStrategies> kTable = {{
      {Strategy::kCheckpointing,
       {{{"plan", "checkpoint = \"all\""},
         {"deepspeed", "\"activation_checkpointing\": {"},
         {"hf", "\"gradient_checkpointing\": true"},
         {"lightning", "the Trainer has no activation-checkpointing switch"},
         {"accelerate", "the config has no activation-checkpointing key"}}}},
      {Strategy::kAdamW8bit,
       {{{"plan", "optimizer = \"adamw8bit\""},
         {"deepspeed", "bitsandbytes.optim.AdamW8bit"},
         {"hf", "\"optim\": \"adamw_bnb_8bit\""},
         {"lightning", "\"class\": \"bitsandbytes.optim.AdamW8bit\""},
         {"accelerate", "the script builds bitsandbytes.optim.AdamW8bit("}}}},
      {Strategy::kOffload,
       {{{"plan", "offload_optimizer = true"},
         {"deepspeed", "\"offload_optimizer\": {"},
         {"hf", "\"deepspeed\": \"ds_config.json\""},
         {"lightning", "\"offload_optimizer\": {"},
         {"accelerate", "deepspeed_config_file: 'ds_config.json'"}}}},
      {Strategy::kBf16,
       {{{"plan", "precision = \"bf16\""},
         {"deepspeed", "\"torch_autocast\": {\n    \"enabled\": true,\n    \"dtype\": \"bfloat16\""},
         {"hf", "\"bf16\": true"},
         {"lightning", "\"precision\": \"bf16-mixed\""},
         {"accelerate", "mixed_precision: 'bf16'"}}}},
      {Strategy::kAdafactor,
       {{{"plan", "optimizer = \"adafactor\""},
         {"deepspeed", "transformers.optimization.Adafactor"},
         {"hf", "\"optim\": \"adafactor\""},
         {"lightning", "\"class\": \"transformers.optimization.Adafactor\""},
         {"accelerate", "the script builds transformers.optimization.Adafactor("}}}},
  }};
  return kTable;
}

const StrategyRecipe& recipe_of(Strategy strategy) { return strategy_recipes()[static_cast<std::size_t>(strategy)]; }

}  // namespace oomtune
