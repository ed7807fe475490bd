"""Defaults lists, interpolation and overrides."""

from __future__ import annotations

import pytest

from rl_config import ConfigError, load_config, load_yaml_dict

BASE = "pretrain: m\n"


def test_config_defaults_later_entries_win_and_file_wins_last(write_yaml) -> None:
    write_yaml("config/a.yaml", "seed: 1\nexp_name: from_a\nrpc_timeout: 11\n")
    write_yaml("config/b.yaml", "seed: 2\nexp_name: from_b\n")
    path = write_yaml(
        "exp/main.yaml",
        "defaults:\n  - ../config/a@_here_\n  - ../config/b@_here_\n" + BASE + "exp_name: mine\n",
    )
    cfg = load_config(path)
    assert cfg.seed == 2  # b after a
    assert cfg.rpc_timeout == 11  # only in a
    assert cfg.exp_name == "mine"  # the file's own key, merged last (implicit _self_)


def test_an_apps_section_from_a_defaults_entry_is_kept(write_yaml) -> None:
    """A config extending an app's config (`defaults: [cpu_default, _self_]`) keeps that app's
    own section (`rlvr_app:`): it was dropped as a variable (its keys come from a defaults
    entry), so the run lost its warm-up and data generation without a word. The file's own
    keys still merge into it; another app's section is still a variable."""
    from rl_config.loading import load_app_config

    write_yaml("exp/base.yaml", BASE + "rlvr_app: {warmup: {steps: 40}, use_ray: true}\n"
               "agentic_app: {x: 1}\n")  # fmt: skip
    path = write_yaml("exp/main.yaml", "defaults: [base, _self_]\nseed: 3\n")
    cfg, section = load_app_config(path, section="rlvr_app")
    assert cfg.seed == 3 and section == {"warmup": {"steps": 40}, "use_ray": True}
    merged = write_yaml("exp/merged.yaml", "defaults: [base, _self_]\nrlvr_app: {use_ray: false}\n")
    assert load_app_config(merged, section="rlvr_app")[1] == {
        "warmup": {"steps": 40}, "use_ray": False}  # fmt: skip
    assert load_app_config(path, ["rlvr_app.warmup.steps=0"], section="rlvr_app")[1] == {
        "warmup": {"steps": 0}, "use_ray": True}  # fmt: skip


def test_config_defaults_self_first_lets_defaults_win(write_yaml) -> None:
    write_yaml("config/a.yaml", "exp_name: from_a\n")
    path = write_yaml(
        "exp/main.yaml",
        "defaults:\n  - _self_\n  - ../config/a@_here_\n" + BASE + "exp_name: mine\n",
    )
    assert load_config(path).exp_name == "from_a"


def test_config_local_defaults_shadow_library(write_yaml) -> None:
    write_yaml(
        "config/traj_envs.yaml",
        "custom_env:\n  Mine:\n    env_type: sokoban\n    max_steps: 4\n",
    )
    path = write_yaml(
        "exp/main.yaml",
        "defaults:\n  - ../config/traj_envs@_here_\n  - ../config/deepspeed_zero2@_here_\n"
        + BASE
        + "custom_envs:\n  Mine: ${custom_env.Mine}\n"
        "actor_train:\n  strategy_args:\n    strategy_name: deepspeed_train\n"
        "    strategy_config: ${deepspeed_zero2}\n",
    )
    cfg = load_config(path)
    assert cfg.custom_envs["Mine"].max_steps == 4  # local traj_envs, not the library's
    assert cfg.actor_train.strategy_args is not None
    assert cfg.actor_train.strategy_args.strategy_config is not None
    assert (
        cfg.actor_train.strategy_args.strategy_config
        == load_yaml_dict(path)["actor_train"]["strategy_args"]["strategy_config"]
    )
    assert cfg.actor_train.strategy_args.strategy_config["zero_optimization"]["stage"] == 2


def test_config_missing_default_names_entry_and_search_path(write_yaml) -> None:
    path = write_yaml("exp/main.yaml", "defaults:\n  - ../config/nope@_here_\n" + BASE)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.issues[0].path == "defaults"
    assert "nope" in str(info.value) and "library" in str(info.value)


def test_a_defaults_entry_outside_the_configs_tree_is_refused(write_yaml, tmp_path) -> None:
    """`../` climbed anywhere: `../../outside@_here_` merged a YAML file from outside the
    config's directory into it (and `rl-config check` printed it). Now only the config's own
    tree, ROLL's fragment folder beside it (`../config/`) and the library may be read."""
    write_yaml("outside.yaml", "exp_name: leaked\n")
    write_yaml("runs/other/frag.yaml", "exp_name: leaked\n")
    write_yaml("runs/config/frag.yaml", "exp_name: roll_fragment\n")
    write_yaml("runs/exp/sub/frag.yaml", "exp_name: own_tree\n")
    for entry, leaked in [("../../outside", tmp_path / "outside.yaml"),
                          ("../other/frag", tmp_path / "runs/other/frag.yaml")]:  # fmt: skip
        path = write_yaml("runs/exp/main.yaml", f"defaults: [{entry}@_here_, _self_]\n" + BASE)
        with pytest.raises(ConfigError) as info:
            load_config(path)
        (issue,) = info.value.issues
        assert (
            issue.path == "defaults" and f"entry {entry!r} resolves to {leaked}," in issue.message
        )
        assert info.value.source == str(path)
    roll = write_yaml("runs/exp/roll.yaml", "defaults: [../config/frag@_here_, _self_]\n" + BASE)
    assert load_config(roll).exp_name == "roll_fragment"
    own = write_yaml("runs/exp/own.yaml", "defaults: [sub/frag@_here_, _self_]\n" + BASE)
    assert load_config(own).exp_name == "own_tree"


def test_a_defaults_entry_symlinked_out_of_the_tree_is_refused(write_yaml, tmp_path) -> None:
    """A link inside the config's directory to a file outside it is judged by its target."""
    secret = write_yaml("secret/frag.yaml", "exp_name: leaked\n")
    path = write_yaml("exp/main.yaml", "defaults: [frag@_here_, _self_]\n" + BASE)
    (tmp_path / "exp" / "frag.yaml").symlink_to(secret)
    with pytest.raises(ConfigError, match=f"entry 'frag' resolves to {secret}, outside"):
        load_config(path)


def test_config_interpolation_and_user_variables(write_yaml) -> None:
    path = write_yaml(
        "main.yaml",
        BASE + "my_lr: 3.0e-6\nexp_name: run_${seed}\nseed: 7\n"
        "actor_train:\n  training_args:\n    learning_rate: ${my_lr}\n",
    )
    cfg = load_config(path)
    assert cfg.exp_name == "run_7"
    assert cfg.actor_train.training_args.learning_rate == pytest.approx(3e-6)
    assert "my_lr" not in load_yaml_dict(path)


def test_config_unreferenced_unknown_top_key_fails(write_yaml) -> None:
    path = write_yaml("main.yaml", BASE + "rollout_batch_sise: 4\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "rollout_batch_sise: unknown key; did you mean 'rollout_batch_size'?" in str(info.value)


def test_config_broken_interpolation_names_key(write_yaml) -> None:
    path = write_yaml("main.yaml", BASE + "exp_name: ${nowhere.x}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.issues[0].path == "exp_name"
    assert "interpolation failed" in info.value.issues[0].message


def test_a_library_fragment_used_without_its_defaults_entry_says_how_to_add_it(write_yaml) -> None:
    """`${deepspeed_zero2}` on a config that does not list the library fragment: the error names
    the library file and the defaults entry that brings it in; with that entry it resolves."""
    override = "actor_train.strategy_args.strategy_config=${deepspeed_zero2}"
    path = write_yaml("main.yaml", BASE)
    with pytest.raises(ConfigError) as info:
        load_yaml_dict(path, [override])
    message = info.value.issues[0].message
    assert "config/deepspeed_zero2.yaml" in message
    assert "defaults: [../config/deepspeed_zero2@_here_]" in message
    with_entry = write_yaml(
        "with.yaml", "defaults:\n  - ../config/deepspeed_zero2@_here_\n  - _self_\n" + BASE
    )
    data = load_yaml_dict(with_entry, [override])
    assert (
        data["actor_train"]["strategy_args"]["strategy_config"]["zero_optimization"]["stage"] == 2
    )
    unknown = write_yaml("other.yaml", BASE + "exp_name: ${no_such_fragment}\n")
    with pytest.raises(ConfigError) as info:
        load_yaml_dict(unknown)
    assert "library" not in info.value.issues[0].message


def test_config_override_kinds(write_yaml) -> None:
    path = write_yaml("main.yaml", BASE + "seed: 1\ntracker_kwargs:\n  project: p\n")
    cfg = load_config(
        path,
        [
            "seed=5",
            "+tracker_kwargs.name=n",
            "++tracker_kwargs.project=q",
            "actor_train.training_args.learning_rate=2e-5",
            "actor_train.device_mapping=list(range(0,1))",
            "system_envs={A: '1'}",
            "~tracker_kwargs.name",
        ],
    )
    assert cfg.seed == 5
    assert cfg.tracker_kwargs == {"project": "q"}
    assert cfg.actor_train.training_args.learning_rate == pytest.approx(2e-5)
    assert cfg.actor_train.device_mapping == [0]
    assert cfg.system_envs == {"A": "1"}


def test_a_bool_for_a_number_is_refused_from_the_file_and_from_the_command_line(
    write_yaml,
) -> None:
    """`max_steps: true` in YAML and `max_steps=true` on the command line both gave max_steps 1."""
    path = write_yaml("main.yaml", BASE + "max_steps: true\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (issue,) = info.value.issues
    assert str(issue) == "max_steps: expected an integer, not a bool (got True (bool))"
    assert str(path) in str(info.value)
    plain = write_yaml("plain.yaml", BASE)
    with pytest.raises(ConfigError) as info:
        load_config(plain, ["actor_train.training_args.learning_rate=false"])
    (issue,) = info.value.issues
    assert issue.path == "actor_train.training_args.learning_rate"
    assert issue.origin == "command line: actor_train.training_args.learning_rate=false"


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("+seed=3", "already exists"),
        ("~nothing_here", "no such key"),
        ("seed", "no '=value'"),
        ("seed=1,2", "sweep"),
        ("a b=1", "expected key=value"),
    ],
)
def test_config_bad_overrides(write_yaml, override: str, fragment: str) -> None:
    path = write_yaml("main.yaml", BASE + "seed: 1\n")
    with pytest.raises(ConfigError, match=fragment):
        load_config(path, [override])


def test_config_file_errors(write_yaml, tmp_path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match=r"\.yaml"):
        load_config(write_yaml("c.yml", BASE))
    with pytest.raises(ConfigError, match="mapping"):
        load_config(write_yaml("list.yaml", "- 1\n- 2\n"))


def test_a_directory_given_as_the_config_names_its_yaml_files(tmp_path):
    (tmp_path / "rlvr_config.yaml").write_text("pretrain: m\n")
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    message = str(info.value)
    assert (
        f"{tmp_path} is a directory" in message and "its YAML files: rlvr_config.yaml)" in message
    )
    assert "--config_path DIR --config_name NAME" in message


def test_an_error_about_a_command_line_override_says_so(tmp_path):
    """The header names the file; an issue about a key the command line set (the key itself, or
    a key under an override of its section) quotes the override, one from the file does not."""
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("pretrain: tiny\nppo_epochs: 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(
            cfg, ["actor_train.training_args.learning_rate=-1", "overlong_penalty.buffer_len=4"]
        )
    text = str(info.value)
    assert f"invalid config in {cfg}" in text
    assert "learning_rate: must be greater than 0 (got -1 (int)) (from the command line: " \
        "actor_train.training_args.learning_rate=-1)" in text  # fmt: skip
    assert "(from the command line: overlong_penalty.buffer_len=4)" in text
    (ppo,) = [line for line in text.splitlines() if "ppo_epochs" in line]
    assert "command line" not in ppo


def test_of_several_overrides_of_a_key_the_error_quotes_the_last(tmp_path):
    """A later override wins (a wrapper script's default, then the user's value): the error
    quotes the one that set the bad value. Before, it quoted the first, a valid one."""
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("pretrain: tiny\n")
    with pytest.raises(ConfigError) as info:
        load_config(cfg, ["async.max_staleness=1", "async.max_staleness=-1"])
    assert "(from the command line: async.max_staleness=-1)" in str(info.value)


def _alias_bomb(levels: int) -> str:
    """YAML whose last key stands for 10**levels strings (each level repeats the one before)."""
    lines = ['l0: &l0 ["x","x","x","x","x","x","x","x","x","x"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("files", "why"),
    [
        # ten million strings in 400 bytes: OmegaConf copied each one (minutes, gigabytes)
        ({"c.yaml": BASE + _alias_bomb(7)}, "c.yaml: its aliases .* more than 200000 values"),
        # the same brought in by a defaults entry, which Hydra loads itself
        (
            {
                "c.yaml": "defaults:\n  - frag/big\n  - _self_\n" + BASE,
                "frag/big.yaml": _alias_bomb(7),
            },
            "big.yaml: its aliases .* more than 200000 values",
        ),
        # an alias inside its own anchor: OmegaConf recursed until RecursionError
        ({"c.yaml": BASE + "loop: &loop [1, *loop]\n"}, "refers to a node that contains it"),
        # a defaults list that leads back to its own file: RecursionError inside Hydra
        (
            {
                "c.yaml": "defaults:\n  - other\n  - _self_\n" + BASE,
                "other.yaml": "defaults:\n  - c\nseed: 2\n",
            },
            "defaults: the defaults lists form a cycle",
        ),
    ],
)
def test_a_config_that_expands_without_end_is_refused_by_name(write_yaml, files, why) -> None:
    paths = [write_yaml(name, text) for name, text in files.items()]
    with pytest.raises(ConfigError, match=why):
        load_config(paths[0])


def test_the_bounds_check_parses_the_same_bytes_once_and_refuses_every_time(
    write_yaml, monkeypatch
) -> None:
    """rl_config.yaml_bounds keeps the digests of the contents that passed: the same bytes again
    (under any name) are not parsed again; a refused content is refused at each load."""
    import uuid

    import yaml

    from rl_config import yaml_bounds

    ok = write_yaml("ok.yaml", BASE + "shared: &s {a: 1}\nagain: *s\n")
    bomb = write_yaml("bomb.yaml", BASE + _alias_bomb(7))
    yaml_bounds.check_yaml_file(ok)
    parsed: list[object] = []
    compose = yaml.compose
    monkeypatch.setattr(yaml, "compose", lambda *a, **k: parsed.append(a) or compose(*a, **k))
    yaml_bounds.check_yaml_file(ok)
    yaml_bounds.check_yaml_file(write_yaml("copy.yaml", ok.read_text()))
    assert parsed == []
    for _ in range(2):
        with pytest.raises(ConfigError, match="bomb.yaml: its aliases"):
            yaml_bounds.check_yaml_file(bomb)
    assert len(parsed) == 2
    unseen = f"x: {uuid.uuid4().hex}\n"  # bytes no other test has checked in this process
    yaml_bounds.check_yaml_file(write_yaml("other.yaml", BASE + unseen))
    assert len(parsed) == 3


def test_a_config_within_the_bounds_may_share_nodes_by_alias(write_yaml) -> None:
    """Aliases that stay small (ROLL shares DeepSpeed fragments this way) load as before."""
    text = BASE + "shared: &s {a: 1, b: [1, 2]}\nagain: *s\n"
    data = load_yaml_dict(write_yaml("c.yaml", text))
    assert data["again"] == data["shared"] == {"a": 1, "b": [1, 2]}
