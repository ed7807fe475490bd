"""model_args.freeze_module_prefix: frozen parameters stay bitwise unchanged through a training
step (hf_infer in process; FSDP2 and DeepSpeed ZeRO-2 on 2 gloo ranks), trained ones move, and a
prefix that matches no parameter is an error naming the key."""

from pathlib import Path

import pytest
import torch

import rl_train
from rl_train.args import parse_model_args
from rl_train.backends.native import fsdp2_averages_over_gloo
from rl_train.dist import spawn
from rl_train.testing import make_batch, nll_loss, train_worker

# torch < 2.10 (vllm-ascend 0.11's 2.7.1): fsdp2_train with several gloo ranks is refused (FSDP2
# summed their gradients there; test_train_fsdp2_torch_floor.py tests the refusal)
FSDP2_ON_GLOO_RANKS = pytest.mark.skipif(
    not fsdp2_averages_over_gloo(),
    reason="fsdp2_train with several gloo ranks is refused on torch < 2.10 (summed gradients)",
)

FROZEN = "model.layers.0."
TARGS = dict(per_device_train_batch_size=4, gradient_accumulation_steps=1, learning_rate=1e-2)


def _params(backend) -> dict[str, torch.Tensor]:
    return {n: t.clone() for b in backend.iter_full_tensor_buckets(1 << 20) for n, t in b}


def _check_frozen(before: dict, after: dict, prefixes: tuple[str, ...]) -> None:
    frozen = [n for n in before if n.startswith(prefixes)]
    trained = [n for n in before if not n.startswith(prefixes)]
    assert frozen and trained
    for name in frozen:
        assert torch.equal(before[name], after[name]), f"frozen {name} changed"
    moved = [n for n in trained if not torch.equal(before[n], after[n])]
    assert len(moved) == len(trained), f"unfrozen parameters unchanged: {set(trained) - set(moved)}"


def test_parse_prefixes_reads_roll_comma_form_and_lists():
    assert parse_model_args(
        {"freeze_module_prefix": "model.visual, lm_head"}
    ).freeze_module_prefix == (
        "model.visual",
        "lm_head",
    )
    assert parse_model_args({"freeze_module_prefix": ["a", "b"]}).freeze_module_prefix == ("a", "b")
    assert parse_model_args({}).freeze_module_prefix == ()
    with pytest.raises(ValueError, match="freeze_module_prefix"):
        parse_model_args({"freeze_module_prefix": ","})


def test_hf_infer_frozen_prefix_unchanged_after_a_step_and_left_out_of_optimizer(tiny_model_path):
    backend = rl_train.build_backend(
        "hf_infer",
        role="actor",
        model_path=tiny_model_path,
        training_args=TARGS,
        model_args={"freeze_module_prefix": FROZEN},
    )
    named = dict(backend.model.named_parameters())
    in_optimizer = {id(p) for g in backend.optimizer.param_groups for p in g["params"]}
    for name, param in named.items():
        assert param.requires_grad == (not name.startswith(FROZEN)), name
        assert (id(param) in in_optimizer) == (not name.startswith(FROZEN)), name
    before = _params(backend)
    backend.train_step(make_batch(4, 16, seed=3), nll_loss)
    _check_frozen(before, _params(backend), (FROZEN,))


def test_prefix_matching_nothing_is_an_error_naming_the_key(tiny_model_path):
    with pytest.raises(ValueError, match=r"freeze_module_prefix: \['model.visual'\] match no"):
        rl_train.build_backend(
            "hf_infer",
            role="actor",
            model_path=tiny_model_path,
            training_args=TARGS,
            model_args={"freeze_module_prefix": "model.layers.,model.visual"},
        )


def test_reference_role_ignores_the_prefix(tiny_model_path):
    """The reference is frozen whole anyway: the prefix is not checked there."""
    backend = rl_train.build_backend(
        "hf_infer",
        role="reference",
        model_path=tiny_model_path,
        model_args={"freeze_module_prefix": "model.visual"},
    )
    assert not any(p.requires_grad for p in backend.model.parameters())


def _dist_run(tmp_path: Path, model: str, strategy: str, cfg: dict) -> None:
    """One step on 2 ranks; the parameters after it against the model file's."""
    from transformers import AutoModelForCausalLM

    spec = dict(
        strategy=strategy,
        steps=1,
        out=str(tmp_path),
        batch=dict(n=8, max_len=16),
        kwargs=dict(
            role="actor",
            model_path=model,
            strategy_config=cfg,
            training_args=TARGS,
            model_args={"freeze_module_prefix": FROZEN},
        ),
    )
    spawn(train_worker, 2, spec, env={"OMP_NUM_THREADS": "1"})
    after = torch.load(tmp_path / "result_rank0.pt", weights_only=True)
    assert "error" not in after["history"][0], after["history"]
    initial = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).state_dict()
    before = {name: initial[name] for name in after["params"]}
    _check_frozen(before, after["params"], (FROZEN,))


@FSDP2_ON_GLOO_RANKS
@pytest.mark.xdist_group("dist")
def test_fsdp2_two_ranks_frozen_prefix_unchanged(tiny_model_path, tmp_path):
    _dist_run(tmp_path, tiny_model_path, "fsdp2_train", {})


@pytest.mark.slow
@pytest.mark.xdist_group("dist")
def test_deepspeed_zero2_two_ranks_frozen_prefix_unchanged(tiny_model_path, tmp_path):
    _dist_run(
        tmp_path,
        tiny_model_path,
        "deepspeed_train",
        {"zero_optimization": {"stage": 2, "overlap_comm": False, "reduce_bucket_size": "auto"}},
    )
