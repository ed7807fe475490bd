"""strict_options: the apps' own option sections are strict at every level."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import pytest

from rl_runtime.cli.app_options import TinyModelOptions, strict_options


@dataclass
class _Warmup:
    steps: int = 10


@dataclass
class _App:
    tiny_model: TinyModelOptions = field(default_factory=TinyModelOptions)
    warmup: _Warmup = field(default_factory=_Warmup)
    use_ray: bool = True


def test_nested_sections_are_built_and_checked():
    app = strict_options(
        _App, {"warmup": {"steps": 3}, "tiny_model": {"hidden_size": 256}}, "x_app"
    )
    assert app.warmup == _Warmup(steps=3)
    assert app.tiny_model.hidden_size == 256 and app.tiny_model.num_layers == 2
    assert strict_options(_App, None, "x_app") == _App()
    with pytest.raises(ValueError, match=r"x_app: unknown key\(s\) \['use_rey'\]"):
        strict_options(_App, {"use_rey": False}, "x_app")
    with pytest.raises(ValueError, match=r"x_app\.warmup: unknown key\(s\) \['step'\]"):
        strict_options(_App, {"warmup": {"step": 3}}, "x_app")


@pytest.mark.parametrize(
    ("shape", "error"),
    [
        ({"hidden_size": 64}, r"x_app\.tiny_model: head_dim = hidden_size // num_heads = 32 < 64"),
        ({"num_heads": 0}, r"x_app\.tiny_model: num_heads must be >= 1, got 0"),
        ({"num_heads": 2, "num_kv_heads": 3}, r"x_app\.tiny_model: .*multiple of num_kv_heads=3"),
    ],
)
def test_a_tiny_model_it_cannot_build_is_refused_naming_the_section(shape, error):
    """A shape `build_tiny_model` refuses was accepted with the options (and by `--dry-run`);
    the run ended in a traceback (ZeroDivisionError for 0 heads) when it built the model."""
    with pytest.raises(ValueError, match=error):
        strict_options(_App, {"tiny_model": shape}, "x_app")


def test_an_app_section_extends_the_shared_run_options():
    from rl_runtime.cli.app_options import AppRunOptions

    @dataclass
    class _Section(AppRunOptions):
        SECTION = "y_app"
        export_hf: bool = True  # an app may change a shared default
        warmup: _Warmup = field(default_factory=_Warmup)

    app = _Section.from_mapping({"use_ray": False, "warmup": {"steps": 2}})
    assert app.use_ray is False and app.warmup.steps == 2 and app.export_hf is True
    from rl_config.errors import ConfigError

    with pytest.raises(ConfigError, match="pretrain: model directory /abs/model does not exist"):
        app.model_path("/abs/model")  # no tiny model asked for: a missing model is an error
    with pytest.raises(ValueError, match=r"y_app: unknown key\(s\) \['use_rey'\]"):
        _Section.from_mapping({"use_rey": False})


@dataclass
class _Typed:
    steps: int = 1
    rate: float | None = None
    use_ray: bool = True
    name: str = "x"


@pytest.mark.parametrize(
    ("raw", "error"),
    [  # each was accepted: "abc" reached a slice mid-run, "maybe" was a true use_ray
        ({"steps": "abc"}, "x_app.steps: expected an integer, got 'abc' (str)"),
        ({"steps": True}, "x_app.steps: expected an integer, got True (bool)"),
        ({"steps": 1.5}, "x_app.steps: expected an integer, got 1.5 (float)"),
        ({"use_ray": "maybe"}, "x_app.use_ray: expected true or false, got 'maybe' (str)"),
        ({"rate": "fast"}, "x_app.rate: expected a finite number or null, got 'fast' (str)"),
        ({"rate": float("inf")}, "x_app.rate: expected a finite number or null, got inf"),
        ({"name": 3}, "x_app.name: expected a string, got 3 (int)"),
    ],
)
def test_a_value_of_the_wrong_type_is_an_error_naming_its_key(raw, error):
    with pytest.raises(ValueError) as err:
        strict_options(_Typed, raw, "x_app")
    assert str(err.value).startswith(error)


def test_values_of_their_fields_types_pass():
    app = strict_options(_Typed, {"steps": 3, "rate": 2, "use_ray": False, "name": "n"}, "x_app")
    assert app == _Typed(steps=3, rate=2, use_ray=False, name="n")
    assert strict_options(_Typed, {"rate": None}, "x_app").rate is None


def test_the_tiny_models_initial_weight_scale_is_an_option_and_must_be_positive(tmp_path):
    app = strict_options(_App, {"tiny_model": {"initializer_range": 0.02}}, "x_app")
    assert app.tiny_model.initializer_range == 0.02 and _App().tiny_model.initializer_range == 0.1
    with pytest.raises(ValueError, match=r"x_app\.tiny_model: initializer_range=0\.0: must be > 0"):
        strict_options(_App, {"tiny_model": {"initializer_range": 0.0}}, "x_app")
    from safetensors.torch import load_file

    from rl_rollout.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "m", **asdict(app.tiny_model))
    assert json.loads((model / "config.json").read_text())["initializer_range"] == 0.02
    weights = load_file(str(model / "model.safetensors"))
    up = next(v for k, v in weights.items() if k.endswith("layers.0.mlp.up_proj.weight"))
    assert 0.018 < float(up.std()) < 0.022  # 32,768 draws of N(0, 0.02^2): std within ~1 %
