"""Loss functions the runtime passes to train backends besides their configured RL loss."""

from __future__ import annotations

import torch

from rl_train.args import LogprobSampling


def sft_loss_fn(batch: dict[str, torch.Tensor], out, ctx) -> tuple[torch.Tensor, dict]:
    """Supervised warm-up: mean negative log-likelihood of the `response_mask` tokens.

    Matches rl_train's `LossFn` (micro_batch, ForwardOutput, LossContext): the micro-batch sum is
    divided by the mini-batch's global token count, so accumulation reproduces the full mean.
    """
    mask = batch["response_mask"].to(out.log_probs.dtype)
    nll_sum = -(out.log_probs * mask).sum()
    loss = nll_sum / max(float(ctx.global_tokens), 1.0)
    return loss, {"sft_nll": loss.detach()}


# a supervised loss fits the model's own full distribution to the data, whatever temperature and
# truncation the rollout samples with (rl_train.losses.forward_sampling)
sft_loss_fn.logprob_sampling = LogprobSampling()  # type: ignore[attr-defined]
