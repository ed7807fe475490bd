"""strict_options: the apps' own option sections are strict at every level."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from rl_runtime.app_options import TinyModelOptions, strict_options


@dataclass
class _Warmup:
    steps: int = 10


@dataclass
class _App:
    tiny_model: TinyModelOptions = field(default_factory=TinyModelOptions)
    warmup: _Warmup = field(default_factory=_Warmup)
    use_ray: bool = True


def test_nested_sections_are_built_and_checked():
    app = strict_options(_App, {"warmup": {"steps": 3}, "tiny_model": {"hidden_size": 64}}, "x_app")
    assert app.warmup == _Warmup(steps=3)
    assert app.tiny_model.hidden_size == 64 and app.tiny_model.num_layers == 2
    assert strict_options(_App, None, "x_app") == _App()
    with pytest.raises(ValueError, match=r"x_app: unknown key\(s\) \['use_rey'\]"):
        strict_options(_App, {"use_rey": False}, "x_app")
    with pytest.raises(ValueError, match=r"x_app\.warmup: unknown key\(s\) \['step'\]"):
        strict_options(_App, {"warmup": {"step": 3}}, "x_app")


def test_an_app_section_extends_the_shared_run_options():
    from rl_runtime.app_options import AppRunOptions

    @dataclass
    class _Section(AppRunOptions):
        SECTION = "y_app"
        export_hf: bool = True  # an app may change a shared default
        warmup: _Warmup = field(default_factory=_Warmup)

    app = _Section.from_mapping({"use_ray": False, "warmup": {"steps": 2}})
    assert app.use_ray is False and app.warmup.steps == 2 and app.export_hf is True
    assert app.model_path("/abs/model") == "/abs/model"  # no tiny model asked for: unchanged
    with pytest.raises(ValueError, match=r"y_app: unknown key\(s\) \['use_rey'\]"):
        _Section.from_mapping({"use_rey": False})
