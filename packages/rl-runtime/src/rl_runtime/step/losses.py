"""Loss functions the runtime passes to train backends besides their configured RL loss."""

from __future__ import annotations

import torch

from rl_algos.losses import sft_loss
from rl_train.args import LogprobSampling


def sft_loss_fn(batch: dict[str, torch.Tensor], out, ctx) -> tuple[torch.Tensor, dict]:
    """Supervised warm-up: mean negative log-likelihood of the `response_mask` tokens.

    Matches rl_train's `LossFn` (micro_batch, ForwardOutput, LossContext): the micro-batch sum is
    divided by the mini-batch's global token count, so accumulation reproduces the full mean.
    """
    nll = sft_loss(out.log_probs, batch["response_mask"])  # rl_algos: -log p on the mask
    loss = nll.loss("token-mean", global_token_count=float(ctx.global_tokens))
    return loss, {"sft_nll": loss.detach()}


# a supervised loss fits the model's own full distribution to the data, whatever temperature and
# truncation the rollout samples with (rl_train.losses.forward_sampling)
sft_loss_fn.logprob_sampling = LogprobSampling()  # type: ignore[attr-defined]
