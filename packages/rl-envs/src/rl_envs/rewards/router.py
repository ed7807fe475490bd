"""Rewards by domain (ROLL's ``rewards:`` section, verl's ``custom_reward_function``).

Offers:

* ``reward_router_spec(rewards, custom_reward_function, *, allow_unsupported=False)
  -> RewardRouterSpec``: pure (no I/O), for dry runs and for the data loader's
  ``tag_to_domain``/``default_domain``.
* ``build_reward_router(rewards, custom_reward_function, *, pool, timeout_s=None)
  -> RewardRouter``: ``RewardRouter.score(items) -> list[RewardOutput]`` in input order, each
  item scored by its domain's reward in the sandbox ``pool``; ``RewardRouter.stats`` counts
  failures per kind since creation.
* ``make_reward_pool(num_workers=2, *, timeout_s=10.0, allow_weak_isolation=False)
  -> SandboxPool``: a sandbox pool with the graders (math-verify) preloaded, for the router.
* ``reward_metrics(items, outputs) -> dict[str, float]``: per-batch metrics, per domain mean
  and count, failures per reason, and the mean of every numeric extra a reward returned
  (``reward/<domain>/extra/<name>``).

Arguments are plain mappings (``model_dump()`` of the config sections, or ``None``):
``rewards``: ``{domain: {reward_fn, worker_cls, tag_included, format_pattern, timeout_s, ...}}``
(ROLL keys this stack does not use are accepted and ignored: model_args, world_size, ...);
``custom_reward_function``: ``{path, name, style, reward_kwargs}``.

A domain's reward is, by name (``DOMAIN_REWARDS``): ``math_rule``, ``code_sandbox``, ``format``
(``format_pattern``), ``custom`` (the ``custom_reward_function``), ``verl_default`` (verl's
dispatch by ``data_source``), ``crossthinkqa`` (ROLL's multiple-choice rule, ``reward_type``
loose | soft | strict, default soft), or a model's (``MODEL_REWARDS``: ``llm_judge``, ``reward_model``;
scored by the caller's ``model_scorers``). Chosen by ``reward_fn``, else by ROLL's
``worker_cls`` class name (``MathRuleRewardWorker`` -> math_rule, ``CodeSandboxRewardWorker`` ->
code_sandbox, ``CrossThinkQARuleRewardWorker`` -> crossthinkqa, ``LLMJudgeRewardWorker`` ->
llm_judge), else by the domain's own name. Without a ``rewards`` section every row goes to one domain: ``custom`` when
``custom_reward_function.path`` is set, else ``verl_default``. A row's domain: its ``domain``
field, else the domain whose ``tag_included`` holds its tag or data source, else
``default_domain`` (``math_rule`` if configured, as ROLL; else a ``verl_default`` domain, verl's
dispatch by data source; else the only domain).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rl_envs.rewards.code_tests import parse_test_cases
from rl_envs.rewards.custom import load_custom_reward
from rl_envs.rewards.extras import numeric_extras
from rl_envs.rewards.manager import RewardInput, RewardManager, RewardOutput
from rl_envs.sandbox.limits import SandboxLimits
from rl_envs.sandbox.pool import SandboxPool

DOMAIN_REWARDS = (
    "math_rule", "code_sandbox", "format", "custom", "verl_default", "crossthinkqa", "llm_judge",
    "reward_model",
)  # fmt: skip
MODEL_REWARDS = ("llm_judge", "reward_model")
"""Rewards a model scores (a generative judge, a sequence-classification reward model): the
caller runs the model and hands the router a scorer per such domain (``RewardRouter``'s
``model_scorers``); the router routes, counts and reports them like the rule rewards."""
ROLL_WORKERS = {
    "MathRuleRewardWorker": "math_rule",
    "CodeSandboxRewardWorker": "code_sandbox",
    "LLMJudgeRewardWorker": "llm_judge",
    "CrossThinkQARuleRewardWorker": "crossthinkqa",
}
CROSSTHINKQA_TYPES = ("loose", "soft", "strict")
"""ROLL's CrossThink-QA reward types (rl_envs.rewards.rules.CROSSTHINKQA_REWARDS)."""
ROLL_UNSUPPORTED_WORKERS = {
    "GeneralRuleRewardWorker": "IFEval instruction-following rules are not implemented",
    "GeneralValRuleRewardWorker": "ROLL's general validation rules are not implemented",
    "MultipleChoiceBoxedRuleRewardWorker": "multiple-choice rules are not implemented",
    "DetectionRewardWorker": "detection (vision) rewards are not implemented",
    "RemoteRewardSystemWorker": "remote reward systems are not implemented",
}
DEFAULT_CODE_TEST_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class CustomRewardSpec:
    """verl's ``custom_reward_function``: ``path`` of the file, ``name`` of the function,
    ``style`` (auto | verl | trl), ``reward_kwargs`` passed to every call."""

    path: str
    name: str = "compute_score"
    style: str = "auto"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DomainRewardSpec:
    """One reward domain: its reward by name, the tags routed to it, its options."""

    domain: str
    reward_fn: str
    tags: tuple[str, ...] = ()
    format_pattern: str | None = None
    timeout_s: float | None = None
    reward_type: str | None = None


@dataclass(frozen=True)
class RewardRouterSpec:
    """Validated routing: domains by name, the custom function, the fallback domain, the
    domains that cannot be scored here (only with ``allow_unsupported``; ``build`` refuses), and
    whether the domains were ``named`` by a ``rewards`` section (False: the one implicit domain,
    ``custom`` or ``verl_default``)."""

    domains: dict[str, DomainRewardSpec]
    custom: CustomRewardSpec | None = None
    default_domain: str | None = None
    unsupported: dict[str, str] = field(default_factory=dict)
    named: bool = True

    def tag_to_domain(self) -> dict[str, str]:
        """ROLL's ``tag_2_domain``: each tag of a ``tag_included`` list to its domain."""
        return {tag: d.domain for d in self.domains.values() for tag in d.tags}

    def domain_of(self, tag: str | None, data_source: str | None = None) -> str | None:
        """The domain of a row with this tag/data source (None: no domain takes it)."""
        table = self.tag_to_domain()
        for key in (tag, data_source):
            if key is not None and key in table:
                return table[key]
        return self.default_domain


def _get(section: Any, key: str, default: Any = None) -> Any:
    if section is None:
        return default
    if hasattr(section, "model_dump"):
        section = section.model_dump()
    if not isinstance(section, Mapping):
        raise TypeError(f"expected a mapping, got {type(section).__name__}")
    value = section.get(key, default)
    return default if value is None else value


def _custom_spec(cfg: Any) -> CustomRewardSpec | None:
    path = _get(cfg, "path")
    if path is None:
        return None
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"custom_reward_function.path must be a file path, got {path!r}")
    kwargs = _get(cfg, "reward_kwargs", {})
    if not isinstance(kwargs, Mapping):
        raise ValueError("custom_reward_function.reward_kwargs must be a mapping")
    return CustomRewardSpec(
        path=path,
        name=str(_get(cfg, "name", "compute_score")),
        style=str(_get(cfg, "style", "auto")),
        reward_kwargs=dict(kwargs),
    )


def _reward_name(domain: str, cfg: Any) -> tuple[str | None, str]:
    """``(registry name, "")`` or ``(None, why it is unsupported)``."""
    explicit = _get(cfg, "reward_fn")
    if explicit is not None:
        if explicit not in DOMAIN_REWARDS:
            raise ValueError(
                f"rewards.{domain}.reward_fn: unknown reward {explicit!r}; known: "
                f"{list(DOMAIN_REWARDS)}"
            )
        return explicit, ""
    worker = _get(cfg, "worker_cls")
    if worker is not None:
        cls_name = str(worker).rsplit(".", 1)[-1]
        if cls_name in ROLL_WORKERS:
            return ROLL_WORKERS[cls_name], ""
        why = ROLL_UNSUPPORTED_WORKERS.get(cls_name, "an unknown reward worker class")
        return None, f"rewards.{domain}.worker_cls {worker!r}: {why}; set reward_fn"
    if domain in DOMAIN_REWARDS:
        return domain, ""
    return None, (
        f"rewards.{domain}: no reward_fn, and neither worker_cls nor the domain name names one "
        f"of {list(DOMAIN_REWARDS)}"
    )


def reward_router_spec(
    rewards: Any, custom_reward_function: Any = None, *, allow_unsupported: bool = False
) -> RewardRouterSpec:
    """Validate the ``rewards`` and ``custom_reward_function`` sections (see module doc).
    Raises ``ValueError`` naming the key at fault; with ``allow_unsupported`` (dry runs) the
    domains that cannot be scored are listed in ``unsupported`` instead."""
    custom = _custom_spec(custom_reward_function)
    if not rewards:
        name = "custom" if custom is not None else "verl_default"
        return RewardRouterSpec({name: DomainRewardSpec(name, name)}, custom, name, named=False)
    domains: dict[str, DomainRewardSpec] = {}
    unsupported: dict[str, str] = {}
    owner: dict[str, str] = {}
    for domain, cfg in dict(rewards).items():
        reward_fn, why = _reward_name(domain, cfg)
        tags = tuple(str(t) for t in _get(cfg, "tag_included", []))
        for tag in tags:
            if tag in owner and owner[tag] != domain:
                raise ValueError(
                    f"rewards.{domain}.tag_included: tag {tag!r} is already in "
                    f"rewards.{owner[tag]}.tag_included"
                )
            owner[tag] = domain
        if reward_fn is None:
            if not allow_unsupported:
                raise ValueError(why)
            unsupported[domain] = why
            continue
        pattern = _get(cfg, "format_pattern")
        if reward_fn == "format" and not pattern:
            raise ValueError(f"rewards.{domain}: reward_fn format needs format_pattern")
        if reward_fn == "custom" and custom is None:
            raise ValueError(
                f"rewards.{domain}: reward_fn custom needs custom_reward_function.path"
            )
        timeout = _get(cfg, "timeout_s")
        if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
            raise ValueError(f"rewards.{domain}.timeout_s must be > 0, got {timeout!r}")
        reward_type = _get(cfg, "reward_type")
        if reward_type is not None and reward_fn != "crossthinkqa":
            raise ValueError(
                f"rewards.{domain}.reward_type={reward_type!r}: only crossthinkqa reads it "
                f"(this domain's reward is {reward_fn})"
            )
        if reward_fn == "crossthinkqa":
            reward_type = reward_type or "soft"
            if reward_type not in CROSSTHINKQA_TYPES:
                raise ValueError(
                    f"rewards.{domain}.reward_type={reward_type!r}: one of {list(CROSSTHINKQA_TYPES)}"
                )
        domains[domain] = DomainRewardSpec(domain, reward_fn, tags, pattern, timeout, reward_type)
    if custom is not None and not any(d.reward_fn == "custom" for d in domains.values()):
        raise ValueError(
            "custom_reward_function.path is set but no rewards domain uses it (set "
            "reward_fn: custom on a domain, or drop the rewards section)"
        )
    default = "math_rule" if "math_rule" in domains else None
    if default is None:  # verl's dispatch by data_source takes the rows no other domain does
        default = next((d for d, s in domains.items() if s.reward_fn == "verl_default"), None)
    if default is None and len(domains) == 1 and not unsupported:
        default = next(iter(domains))
    return RewardRouterSpec(domains, custom, default, unsupported)


class CodeRewardManager(RewardManager):
    """``code_sandbox``: the row's tests (``columns["test_cases"]``/``case_type``, or a
    ``{"inputs", "outputs"}`` ground truth) run in the sandbox; ``timeout_s`` is per test."""

    def __init__(self, pool: SandboxPool, *, per_test_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(pool, "code_sandbox", **kwargs)
        self.per_test_timeout_s = per_test_timeout_s

    def _kwargs(self, item: RewardInput) -> dict[str, Any]:
        columns = item.columns or {}
        return {
            "test_cases": columns.get("test_cases"),
            "case_type": columns.get("case_type"),
            "per_test_timeout_s": self.per_test_timeout_s,
        }

    def _timeout(self, item: RewardInput) -> float | None:
        columns = item.columns or {}
        try:
            tests = parse_test_cases(
                columns.get("test_cases"), columns.get("case_type"), item.ground_truth
            )
        except ValueError:
            return None  # the sandboxed call raises the same error: counted as a failure
        return self.per_test_timeout_s * len(tests) + 5.0


def _manager(spec: DomainRewardSpec, custom: Any, pool: SandboxPool, timeout_s: float | None):
    timeout = spec.timeout_s if spec.timeout_s is not None else timeout_s
    if spec.reward_fn == "code_sandbox":
        per_test = spec.timeout_s or DEFAULT_CODE_TEST_TIMEOUT_S
        return CodeRewardManager(pool, per_test_timeout_s=per_test)
    if spec.reward_fn == "format":
        return RewardManager(pool, "format", timeout_s=timeout,
                             options={"pattern": spec.format_pattern})  # fmt: skip
    if spec.reward_fn == "crossthinkqa":
        return RewardManager(pool, "crossthinkqa", timeout_s=timeout,
                             options={"reward_type": spec.reward_type})  # fmt: skip
    if spec.reward_fn == "custom":
        return RewardManager(pool, custom[0], timeout_s=timeout, options=custom[1])
    name = "default" if spec.reward_fn == "verl_default" else spec.reward_fn
    return RewardManager(pool, name, timeout_s=timeout)


ModelScorer = Callable[[list[RewardInput]], list[RewardOutput]]
"""A model reward's scorer: one ``RewardOutput`` per item, in order (a failed or unreadable
score is ``ok=False`` with its kind, never a bare 0)."""


class _ModelManager:
    """A ``MODEL_REWARDS`` domain: the caller's scorer, its output count checked."""

    def __init__(self, domain: str, scorer: ModelScorer) -> None:
        self.domain, self.scorer = domain, scorer

    def score(self, items: list[RewardInput]) -> list[RewardOutput]:
        out = list(self.scorer(items))
        if len(out) != len(items):
            raise RuntimeError(
                f"rewards.{self.domain}: the model scorer returned {len(out)} outputs for "
                f"{len(items)} items"
            )
        return out


class RewardRouter:
    """Scores each item with its domain's reward: rule rewards in the sandbox, model rewards
    (``MODEL_REWARDS``) by ``model_scorers[domain]``, which the caller runs."""

    def __init__(
        self,
        spec: RewardRouterSpec,
        *,
        pool: SandboxPool,
        timeout_s: float | None = None,
        model_scorers: Mapping[str, ModelScorer] | None = None,
    ) -> None:
        if spec.unsupported:
            raise ValueError("; ".join(spec.unsupported.values()))
        self.spec = spec
        custom = None
        if spec.custom is not None:
            loaded = load_custom_reward(spec.custom.path, spec.custom.name, spec.custom.style)
            custom = (loaded, spec.custom.reward_kwargs)
        scorers = dict(model_scorers or {})
        self.managers: dict[str, Any] = {}
        for name, d in spec.domains.items():
            if d.reward_fn in MODEL_REWARDS:
                if name not in scorers:
                    raise ValueError(
                        f"rewards.{name}: reward {d.reward_fn} is scored by a model, and no "
                        "model scorer was given for it (the RLVR pipeline starts one)"
                    )
                self.managers[name] = _ModelManager(name, scorers[name])
            else:
                self.managers[name] = _manager(d, custom, pool, timeout_s)
        self.stats: Counter[str] = Counter()

    def domain_of(self, item: RewardInput) -> str | None:
        if item.domain is not None:
            return item.domain
        tag = (item.columns or {}).get("tag")
        return self.spec.domain_of(tag if isinstance(tag, str) else None, item.data_source)

    def score(self, items: list[RewardInput]) -> list[RewardOutput]:
        """One output per item, in input order; an item of no configured domain is a failure
        of kind ``unknown_domain``."""
        outputs: list[RewardOutput | None] = [None] * len(items)
        by_domain: dict[str, list[int]] = defaultdict(list)
        for i, item in enumerate(items):
            domain = self.domain_of(item)
            if domain in self.managers:
                by_domain[domain].append(i)
            else:
                error = f"no reward domain for domain={domain!r} data_source={item.data_source!r}"
                outputs[i] = RewardOutput(0.0, False, "unknown_domain", error)
        for domain, indices in by_domain.items():
            scored = self.managers[domain].score([items[i] for i in indices])
            for i, out in zip(indices, scored, strict=True):
                outputs[i] = out
        done = [o for o in outputs if o is not None]
        for out in done:
            self.stats["calls"] += 1
            if not out.ok:
                self.stats["failures"] += 1
                self.stats[f"failure.{out.kind}"] += 1
        return done

    def domains(self, items: list[RewardInput]) -> list[str | None]:
        """The domain each item is routed to."""
        return [self.domain_of(i) for i in items]

    def metrics(self, items: list[RewardInput], outputs: list[RewardOutput]) -> dict[str, float]:
        """``reward_metrics`` with the domains this router resolved."""
        return reward_metrics(items, outputs, self.domains(items))


def make_reward_pool(
    num_workers: int = 2,
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    allow_weak_isolation: bool = False,
) -> SandboxPool:
    """A sandbox pool for ``RewardRouter``: math-verify and the graders preloaded and warmed
    up (calls run as an unprivileged user that may not import them itself). Close it after
    use (``with make_reward_pool() as pool:``)."""
    from rl_envs.rewards import MATH_PRELOAD, MATH_WARMUP

    limits = SandboxLimits(
        timeout_s=timeout_s, memory_mb=memory_mb, allow_weak_isolation=allow_weak_isolation
    )
    return SandboxPool(num_workers, limits=limits, preload=MATH_PRELOAD, warmup=MATH_WARMUP)


def build_reward_router(
    rewards: Any,
    custom_reward_function: Any = None,
    *,
    pool: SandboxPool,
    timeout_s: float | None = None,
) -> RewardRouter:
    """``RewardRouter`` for the ``rewards`` and ``custom_reward_function`` config sections;
    ``timeout_s``: per reward call where a domain sets none (None: the pool's limit)."""
    return RewardRouter(
        reward_router_spec(rewards, custom_reward_function), pool=pool, timeout_s=timeout_s
    )


def reward_metrics(
    items: list[RewardInput],
    outputs: list[RewardOutput],
    domains: list[str | None] | None = None,
) -> dict[str, float]:
    """Metrics of one scored batch: ``reward/mean``, ``reward/<domain>/{mean,count,failures}``,
    ``reward/failures`` and ``reward/failures/<kind>`` (counts), and
    ``reward/<domain>/extra/<extra>`` (mean of each numeric entry a reward returned besides
    ``score``, ``rl_envs.rewards.extras.numeric_extras``; under ``extra/``, so that an extra
    named ``mean`` or ``failures`` cannot replace the domain's own metric). ``domains``: per item (default: ``item.domain`` or ``unknown``)."""
    names = domains or [i.domain for i in items]
    metrics: dict[str, float] = {}
    sums: dict[str, list[float]] = defaultdict(list)
    extras: dict[str, list[float]] = defaultdict(list)
    failures: Counter[str] = Counter()
    domain_failures: Counter[str] = Counter()
    for name, out in zip(names, outputs, strict=True):
        domain = name or "unknown"
        sums[domain].append(out.reward)
        if not out.ok:
            failures[out.kind] += 1
            domain_failures[domain] += 1
        for key, number in numeric_extras(out.extra).values.items():
            extras[f"reward/{domain}/extra/{key}"].append(number)
    rewards = [r for values in sums.values() for r in values]
    metrics["reward/mean"] = sum(rewards) / len(rewards) if rewards else 0.0
    for domain, values in sums.items():
        metrics[f"reward/{domain}/mean"] = sum(values) / len(values)
        metrics[f"reward/{domain}/count"] = float(len(values))
        metrics[f"reward/{domain}/failures"] = float(domain_failures[domain])
    metrics["reward/failures"] = float(sum(failures.values()))
    metrics.update({f"reward/failures/{k}": float(v) for k, v in failures.items()})
    metrics.update({k: sum(v) / len(v) for k, v in extras.items()})
    return metrics
