"""The RLVR pipeline's parts: compose plan, prompt data, rollout with dynamic sampling, model rewards, held-out evaluation, metrics, warm-up."""
