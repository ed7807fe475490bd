"""The supervised fine-tuning pipeline's parts: the compose plan and the recipe's step parts (its
rows -> masked token rows, and packing, are core: rl_runtime.step.sft_data, step.sft_packing)."""
