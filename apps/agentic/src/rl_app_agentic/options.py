"""App-only options (the `agentic_app:` section of a config).

The experiment itself is validated by rl_config (ROLL key names); `agentic_app:` holds what only
this app needs: building the tiny model, the supervised warm-up, Ray vs in-process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rl_runtime.cli.app_options import AppRunOptions


@dataclass
class WarmupOptions:
    """Supervised warm-up on BFS-solver demonstrations before RL (0 steps = off); it uses
    actor_train's optimizer, at `learning_rate` when set."""

    steps: int = 0
    episodes: int = 256
    batch_size: int = 32
    #: learning rate of the warm-up (None: actor_train's); RL then runs at actor_train's rate
    learning_rate: float | None = None
    #: probability that a demonstrated move is a random action instead of the solver's: the
    #: warm-up then imitates a noisy expert, and RL has to learn to stop making those moves
    action_noise: float = 0.0


@dataclass
class AppOptions(AppRunOptions):
    SECTION = "agentic_app"
    PIPELINE = "agentic"
    warmup: WarmupOptions = field(default_factory=WarmupOptions)
    export_hf: bool = True
    render_val_envs: int = 2
    #: also evaluate greedy decoding (`val/greedy/*`) next to the sampled policy (`val/*`)
    eval_greedy: bool = True
    #: after every sync compare the engine's weights with the trainer's (sync/max_abs_diff)
    check_sync_weights: bool = False
    #: rl_rollout AgentLoop mode: "lockstep" batches one turn of every live episode per generate
    #: call (reproducible: a resumed run samples what an uninterrupted one does); "async" lets
    #: every episode run ahead on its own (faster with uneven episodes)
    agent_loop_mode: str = "lockstep"
