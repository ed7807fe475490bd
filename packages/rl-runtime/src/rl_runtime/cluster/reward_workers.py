"""The workers of model rewards (Ray actors, or in-process with `--no-ray`), one role per model
domain (rl_runtime.compose.model_rewards), registered by reward kind (`REWARD_WORKERS`).

`JudgeWorker`: a generative judge behind rl-rollout's engine protocol (`build_engine`: hf_infer
or vllm, as rollout): chats in, verdict texts out. `RewardModelWorker`: a
sequence-classification model (`AutoModelForSequenceClassification`, safetensors only) scoring
(prompt, response) chats in batches: the logit of its one label. Neither has a method that
changes its weights: a reward model is never trained nor synced. Both `sleep` and `wake_up`
(the driver calls them around a scoring when the role shares its devices with another).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rl_runtime.cluster.workers import _init_process
from rl_runtime.state.seeds import engine_seed, sample_seed, worker_seed


class JudgeWorker:
    """One judge engine; `judge(chats, sampling, batch_size)` -> one verdict text per chat."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        dist_env: Mapping[str, str],
        model_path: str,
        strategy_name: str,
        strategy_config: Mapping[str, Any] | None = None,
        dtype: str = "float32",
        seed: int = 0,
        template: str = "native",
    ) -> None:
        _init_process(dist_env, worker_seed(seed, "judge", rank))
        from transformers import AutoTokenizer

        from rl_rollout import build_engine
        from rl_rollout.templates import get_template

        self.engine = build_engine(
            strategy_name,
            model_path,
            dict(strategy_config or {}),
            dtype=dtype,
            seed=engine_seed(seed, rank),
        )
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.template = get_template(template, self.tokenizer)

    def ready(self) -> bool:
        return True

    def judge(
        self, chats: Sequence[list[dict[str, str]]], sampling: Any, batch_size: int
    ) -> list[str]:
        """Each chat rendered with the judge's template and completed (`sampling`, request i
        seeded `rl_runtime.state.seeds.sample_seed(sampling.seed, i)`), `batch_size` requests per engine call; the
        completions decoded without special tokens, in order."""
        import msgspec

        from rl_config.records import GenerationRequest

        ids = [
            self.tokenizer(self.template.prefix(chat), add_special_tokens=False)["input_ids"]
            for chat in chats
        ]
        seed = sampling.seed or 0
        texts: list[str] = []
        for start in range(0, len(ids), max(1, batch_size)):
            requests = [
                GenerationRequest(
                    request_id=str(i),
                    prompt_ids=list(ids[i]),
                    sampling=msgspec.structs.replace(sampling, n=1, seed=sample_seed(seed, i)),
                )
                for i in range(start, min(len(ids), start + batch_size))
            ]
            results = asyncio.run(self.engine.generate(requests))
            by_id = {r.request_id: r for r in results}
            texts += [
                self.tokenizer.decode(by_id[q.request_id].output_ids, skip_special_tokens=True)
                for q in requests
            ]
        return texts

    def sleep(self, level: int = 1) -> None:
        self.engine.sleep(level)

    def wake_up(self) -> None:
        self.engine.wake_up()

    def shutdown(self) -> None:
        self.engine.shutdown()


class RewardModelWorker:
    """A sequence-classification reward model; `score(chats, batch_size)` -> one float per
    (prompt, response) chat: the model's one logit at the chat's last token."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        dist_env: Mapping[str, str],
        model_path: str,
        dtype: str = "float32",
        seed: int = 0,
        template: str = "native",
        strategy_name: str = "hf_infer",
        strategy_config: Mapping[str, Any] | None = None,
    ) -> None:
        _init_process(dist_env, worker_seed(seed, "reward_model", rank))
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from rl_rollout.templates import get_template
        from rl_sync.device import torch_device

        self.device = torch_device()
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.template = get_template(template, self.tokenizer)
        model, info = AutoModelForSequenceClassification.from_pretrained(
            model_path, dtype=getattr(torch, dtype), use_safetensors=True, output_loading_info=True
        )
        if info["missing_keys"]:  # e.g. a causal LM: its score head would be random
            raise ValueError(
                f"reward model {model_path}: weights missing from the checkpoint "
                f"{sorted(info['missing_keys'])[:4]}; it is not a sequence-classification model"
            )
        if model.config.num_labels != 1:
            raise ValueError(
                f"reward model {model_path}: {model.config.num_labels} labels; a reward model "
                "scores with one"
            )
        if model.config.pad_token_id is None:  # the last token is found by the pad id
            model.config.pad_token_id = self.pad_id
        self.model = model.to(self.device).eval().requires_grad_(False)

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)

    def ready(self) -> bool:
        return True

    def encode(self, chat: list[dict[str, str]]) -> list[int]:
        """The token ids of a (user prompt, assistant response) chat: the template's prompt,
        then the response (as the policy produced them: the response follows the generation
        prompt)."""
        prompt = self.template.prefix(chat[:-1])
        text = prompt + chat[-1]["content"]
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    @torch.no_grad()
    def score(self, chats: Sequence[list[dict[str, str]]], batch_size: int) -> list[float]:
        """One score per chat, `batch_size` chats per forward (right-padded with the pad id, an
        attention mask over the real tokens)."""
        rows = [self.encode(chat) for chat in chats]
        out: list[float] = []
        for start in range(0, len(rows), max(1, batch_size)):
            part = rows[start : start + batch_size]
            width = max(len(r) for r in part)
            ids = torch.full((len(part), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(part), width), dtype=torch.long)
            for i, r in enumerate(part):
                ids[i, : len(r)] = torch.tensor(r)
                mask[i, : len(r)] = 1
            logits = self.model(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device)
            ).logits  # [b, 1]
            out += [float(x) for x in logits[:, 0].float().cpu()]
        return out

    def sleep(self, level: int = 1) -> None:
        """Free the device: the weights to the host (level 1 and 2 alike: they cannot be
        fetched again from a trainer)."""
        self.model.to("cpu")

    def wake_up(self) -> None:
        self.model.to(self.device)

    def shutdown(self) -> None:
        pass


REWARD_WORKERS: dict[str, type] = {"llm_judge": JudgeWorker, "reward_model": RewardModelWorker}
"""Worker class by model reward kind."""


def reward_role_spec(role: Any, model_path: str, seed: int) -> Any:
    """The `RoleSpec` of a model reward's `RolePlan` (`role.reward` picks the worker class)."""
    from rl_runtime.cluster.cluster import RoleSpec

    if role.reward not in REWARD_WORKERS:
        raise KeyError(
            f"{role.role}: unknown reward worker {role.reward!r}; known: {sorted(REWARD_WORKERS)}"
        )
    kwargs = dict(
        model_path=model_path, strategy_name=role.strategy_name,
        strategy_config=dict(role.strategy_config), dtype=role.dtype, seed=seed,
        template=role.template or "native",
    )  # fmt: skip
    return RoleSpec(role.role, REWARD_WORKERS[role.reward], role.device_mapping, kwargs, 1)
