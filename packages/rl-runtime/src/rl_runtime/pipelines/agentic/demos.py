"""Expert demonstrations for a supervised warm-up, token-exact with the agent loop.

A `ScriptedEngine` (the Engine protocol, no model) answers every request with the BFS solver's next
action for the env being played, and the real `AgentLoop` turns the episode into a `Trajectory`.
So the warm-up data has exactly the prompt/turn/token layout RL rollouts have.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from rl_config.records import GenerationRequest, GenerationResult, SamplingParams, Trajectory
from rl_runtime.step.envs import env_assignments, make_envs


class ScriptedEngine:
    """Answers with `solver(env)`'s next action text + the end-of-turn token; log-probs are 0.

    With `action_noise` p, each move is, with probability p, a uniformly random action of the env
    (a noisy expert: its most likely move is still the solver's).
    """

    def __init__(
        self, tokenizer: Any, end_token_id: int, action_noise: float = 0.0, seed: int = 0
    ) -> None:
        if not 0.0 <= action_noise <= 1.0:
            raise ValueError(f"action_noise must be in [0, 1], got {action_noise}")
        self.tokenizer = tokenizer
        self.end_token_id = end_token_id
        self.action_noise = action_noise
        self.rng = random.Random(seed)
        self.env: Any = None
        self._version = 0

    def next_action_text(self) -> str:
        from rl_envs.solvers import solve

        if self.action_noise and self.rng.random() < self.action_noise:
            fmt = self.env.state.answer_format
            return fmt.format(action=self.rng.choice(list(self.env.action_names)))
        plan = solve(self.env)
        return plan[0] if plan else ""

    @property
    def weight_version(self) -> int:
        return self._version

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        results = []
        for req in requests:
            text = self.next_action_text()
            ids = [*list(self.tokenizer.encode(text, add_special_tokens=False)), self.end_token_id]
            for i in range(req.sampling.n):
                results.append(
                    GenerationResult(
                        request_id=req.request_id,
                        prompt_ids=list(req.prompt_ids),
                        output_ids=ids,
                        output_log_probs=[0.0] * len(ids),
                        finish_reason="stop",
                        weight_version=self._version,
                        sample_index=i,
                    )
                )
        return results

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        self._version = version

    def sleep(self, level: int = 1) -> None:
        return None

    def wake_up(self) -> None:
        return None

    def abort(self, request_ids: Iterable[str]) -> None:
        return None

    def shutdown(self) -> None:
        return None

    def state_dict_for_check(self) -> dict[str, torch.Tensor]:
        return {}


def tags_without_solver(
    tags: Sequence[str], env_configs: Mapping[str, Mapping[str, Any]]
) -> dict[str, str]:
    """`{tag: why}` for the tags of `tags` whose env the BFS solver cannot play
    (rl_envs.solvers: the grid games): a solver warm-up has no demonstration of them. Each is
    built and reset once, as `solver_demonstrations` plays it."""
    from rl_envs.solvers import UnsolvableError, solve_actions

    out: dict[str, str] = {}
    for env, _seed, _group, tag in make_envs(
        [("probe", tag, 0) for tag in dict.fromkeys(tags)], env_configs
    ):
        try:
            env.reset()
            solve_actions(env)
        except UnsolvableError:  # this map has no solution; the solver plays the env type
            pass
        except TypeError:
            spec = env_configs.get(tag)
            out[tag] = f"env type {str(spec.get('env_type') if spec else tag)!r} has no solver"
        finally:
            env.close()
    return out


def solver_demonstrations(
    model_path: str,
    *,
    tags: Sequence[str],
    env_configs: Mapping[str, Mapping[str, Any]],
    num_episodes: int,
    base_seed: int,
    max_tokens_per_step: int,
    max_sequence_length: int = 4096,
    only_successful: bool = True,
    action_noise: float = 0.0,
    seed: int = 0,
) -> list[Trajectory]:
    """`num_episodes` solver-played episodes (round-robin over `tags`) as trajectories; with
    `action_noise`, a noisy expert's (see `ScriptedEngine`)."""
    from transformers import AutoTokenizer

    from rl_rollout.agent_loop import AgentLoop

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    end_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if not isinstance(end_id, int) or end_id < 0:
        end_id = int(tokenizer.eos_token_id)
    engine = ScriptedEngine(tokenizer, int(end_id), action_noise=action_noise, seed=seed)
    loop = AgentLoop(
        engine,
        tokenizer,
        max_tokens_per_step=max_tokens_per_step,
        max_running_requests=1,
        max_sequence_length=max_sequence_length,
        sampling=SamplingParams(temperature=0.0, max_new_tokens=max_tokens_per_step),
    )
    assignments = env_assignments(
        tags=list(tags),
        num_env_groups=num_episodes,
        group_size=1,
        num_groups_partition=None,
        base_seed=base_seed,
        epoch=0,
        split="demo",
    )
    out: list[Trajectory] = []
    for item in make_envs(assignments, env_configs):
        engine.env = item[0]
        trajs = asyncio.run(loop.run_episodes([item]))
        out.extend(t for t in trajs if t.success or not only_successful)
    if not out:
        raise RuntimeError("the solver produced no successful demonstration")
    return out
