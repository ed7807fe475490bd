"""Env managers (which envs a split plays) and env specs by tag."""

from __future__ import annotations

from typing import Any

from rl_config.errors import ConfigError, ConfigIssue
from rl_config.roll_compat import ROLL_TEMPLATE_PLACEHOLDERS
from rl_envs import prompt_options
from rl_envs.prompts import TURN_FIELDS, template_fields
from rl_runtime.compose.components import EnvManagerPlan, EnvSpec


def build_env_manager(mgr: Any, num_episodes: int | None) -> EnvManagerPlan | None:
    if mgr is None:
        return None
    part = mgr.num_groups_partition
    return EnvManagerPlan(
        tags=tuple(mgr.tags),
        num_env_groups=mgr.num_env_groups,
        group_size=mgr.group_size,
        num_groups_partition=tuple(part) if part is not None else None,
        num_episodes=num_episodes,
    )


PROMPT_KEYS = {"agent_system_template": "system_prompt", "agent_template": "turn_template"}
"""ROLL's prompt keys of a ``custom_envs`` entry -> the env constructor option they set."""


def build_env_specs(custom_envs: Any) -> dict[str, EnvSpec]:
    """custom_envs -> EnvSpec per tag. `max_steps` (turns per episode) goes into the env's
    options and must agree with an `env_config.max_steps` given there too; ROLL's
    `agent_system_template` / `agent_template` become the env's `system_prompt` /
    `turn_template` (PROMPT_KEYS), refused for an env type without that option. `env_type` must
    name a registered env type or tag (rl_envs.registry). Each tag's env is built once with its
    options, as a run builds it (`_construction_issues`): what its constructor refuses (an
    unknown option, a missing data file, a bad value) is a config issue naming the key, before
    anything starts, not an exception in a worker after the warm-up."""
    out: dict[str, EnvSpec] = {}
    issues: list[ConfigIssue] = []
    for tag, env in custom_envs.items():
        config = dict(env.env_config or {})
        inner = config.setdefault("max_steps", env.max_steps)
        if inner != env.max_steps:
            raise ValueError(
                f"custom_envs.{tag}.max_steps={env.max_steps} disagrees with "
                f"custom_envs.{tag}.env_config.max_steps={inner}; set one of them"
            )
        try:
            accepted = prompt_options(env.env_type)
        except KeyError as exc:
            issues.append(ConfigIssue(f"custom_envs.{tag}.env_type", str(exc.args[0])))
            continue
        for key, option in PROMPT_KEYS.items():
            found = _prompt_issue(tag, env.env_type, key, getattr(env, key), option, accepted)
            if found is None and getattr(env, key) is not None:
                found = _set_once(tag, key, option, getattr(env, key), config)
            issues += [found] if found is not None else []
        if not any(i.path.startswith(f"custom_envs.{tag}.") for i in issues):
            issues += _construction_issues(tag, env.env_type, config)
        out[tag] = EnvSpec(env_type=env.env_type, config=config)
    if issues:
        raise ConfigError(issues)
    return out


def _prompt_issue(
    tag: str, env_type: str, key: str, value: str | None, option: str, accepted: tuple[str, ...]
) -> ConfigIssue | None:
    """The issue of a prompt key the env cannot honour (None when it can)."""
    if value is None:
        return None
    path = f"custom_envs.{tag}.{key}"
    if option not in accepted:
        takes = ", ".join(accepted) or "none"
        return ConfigIssue(
            path, f"env type {env_type!r} takes no {option} (its prompt options: {takes})"
        )
    if option != "turn_template":
        return None
    try:
        unknown = sorted(template_fields(value) - set(TURN_FIELDS))
    except ValueError as exc:
        return ConfigIssue(path, f"bad template: {exc}")
    if not unknown:
        return None
    # rl-config refuses unknown placeholders; ROLL's own (ROLL_TEMPLATE_PLACEHOLDERS) pass its
    # check with a warning, and are refused here, where the template would be used
    why = [f"{{{n}}} is {ROLL_TEMPLATE_PLACEHOLDERS.get(n, 'unknown')}" for n in unknown]
    allowed = ", ".join("{" + f + "}" for f in TURN_FIELDS)
    return ConfigIssue(
        path, f"uses placeholders this stack does not fill ({'; '.join(why)}); allowed: {allowed}"
    )


def _set_once(
    tag: str, key: str, option: str, value: str, config: dict[str, Any]
) -> ConfigIssue | None:
    """Put `value` into the env options as `option`; a different `env_config.<option>` is an
    issue (None when set)."""
    given = config.setdefault(option, value)
    if given == value:
        return None
    return ConfigIssue(
        f"custom_envs.{tag}.{key}",
        f"disagrees with custom_envs.{tag}.env_config.{option}; set one of them",
    )


def _construction_issues(tag: str, env_type: str, config: dict[str, Any]) -> list[ConfigIssue]:
    """What building the env of `custom_envs.<tag>` with `config` (rl_envs.make_env, as
    rl_runtime.step.envs.make_envs does) raises, as config issues: an unknown option at its key
    (`custom_envs.<tag>.env_config.<key>`, with the close option names and all of them), any
    other error at `custom_envs.<tag>.env_config`. [] when it builds."""
    import difflib
    import re

    from rl_envs import env_options, make_env

    path = f"custom_envs.{tag}.env_config"
    try:
        make_env(env_type, **config).close()
    except TypeError as exc:
        unknown = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
        if unknown is None:
            return [ConfigIssue(path, f"env type {env_type!r}: {exc}")]
        key, known = unknown.group(1), env_options(env_type)
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return [ConfigIssue(f"{path}.{key}", f"env type {env_type!r} takes no option {key!r}"
                            f"{hint} (its options: {', '.join(known)})")]  # fmt: skip
    except (ValueError, KeyError, OSError, ImportError) as exc:
        return [ConfigIssue(path, f"env type {env_type!r}: {exc}")]
    return []
