"""training_args.sum_pi_squared: the actor's no-grad forward also returns sum_v pi(v)^2 of its
log-probs' distribution at each token (the optimal token baseline's statistic), aligned like the
log-probs (column 0 and padding 0), equal on the padded and the packed path, and equal to the
softmax of the model's own logits; a fused log-prob head or a truncated distribution is refused."""

import pytest
import torch

import rl_train
from rl_algos.logprobs import sum_pi_squared_from_logits
from rl_train.testing import make_batch


def test_sum_pi_squared_from_logits_hand_value():
    logits = torch.tensor([[0.0, float(torch.tensor(3.0).log())], [0.0, 0.0]])
    torch.testing.assert_close(sum_pi_squared_from_logits(logits), torch.tensor([0.625, 0.5]))
    # temperature 2 on logits [0, ln 9]: the same distribution as logits [0, ln 3]
    hot = torch.tensor([[0.0, float(torch.tensor(9.0).log())]])
    torch.testing.assert_close(
        sum_pi_squared_from_logits(hot, temperature=2.0), torch.tensor([0.625])
    )


def _actor(path, **extra):
    args = {"per_device_train_batch_size": 4, "sum_pi_squared": True,
            "logprob_sampling": {"temperature": 0.7}, **extra}  # fmt: skip
    return rl_train.build_backend("hf_infer", role="actor", model_path=path, training_args=args)


@pytest.mark.parametrize("path", ["padded", "packed", "shared_prompt"])
def test_the_actor_forward_returns_sum_pi_squared_of_its_distribution(tiny_model_path, path):
    kind = {"use_sequence_packing": path == "packed", "share_prompt_forward": path != "packed"}
    if path == "padded":
        kind["share_prompt_forward"] = False
    backend = _actor(tiny_model_path, **kind)
    batch = make_batch(4, 16, seed=5, group_size=2)
    out = backend.forward(batch)
    assert out.sum_pi_squared is not None and out.log_probs is not None
    with torch.no_grad():
        logits = backend.model(input_ids=batch["input_ids"],
                               attention_mask=batch["attention_mask"]).logits  # fmt: skip
    p = torch.softmax(logits[:, :-1].float() / 0.7, dim=-1)
    valid = batch["attention_mask"][:, 1:].float()
    want = torch.cat([torch.zeros(4, 1), (p * p).sum(-1) * valid], dim=1)
    if path == "shared_prompt":  # the prompt columns of this path's outputs are 0
        want = want * batch["response_mask"]
    torch.testing.assert_close(out.sum_pi_squared, want, atol=1e-5, rtol=1e-5)
    plain = rl_train.build_backend("hf_infer", role="actor", model_path=tiny_model_path,
                                   training_args={"per_device_train_batch_size": 4,
                                                  "logprob_sampling": {"temperature": 0.7}})  # fmt: skip
    assert plain.forward(batch).sum_pi_squared is None
    if path != "shared_prompt":
        torch.testing.assert_close(out.log_probs, plain.forward(batch).log_probs)


def test_a_truncated_distribution_or_a_fused_head_is_refused(tiny_model_path):
    batch = make_batch(2, 12, seed=1)
    with pytest.raises(ValueError, match="truncated distribution is not implemented"):
        _actor(tiny_model_path, logprob_sampling={"top_k": 5}).forward(batch)
    fused = rl_train.build_backend(
        "hf_infer", role="actor", model_path=tiny_model_path,
        training_args={"per_device_train_batch_size": 4, "sum_pi_squared": True},
        strategy_config={"fused_lm_head": True},
    )  # fmt: skip
    with pytest.raises(ValueError, match="fused_lm_head: false"):
        fused.forward(batch)
