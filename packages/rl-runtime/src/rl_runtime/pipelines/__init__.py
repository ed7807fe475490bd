"""One subpackage per pipeline (agentic, rlvr, dpo): its compose plan, data, rollout, evaluation and metrics."""
