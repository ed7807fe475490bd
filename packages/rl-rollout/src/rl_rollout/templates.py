"""Chat templates as token-level building blocks for the agent loop.

The agent loop never re-tokenises model output. It needs the template as pieces it can tokenise
separately and append to token ids it already has:

- ``prefix(messages)``: the first prompt (system + first user message + assistant header), text;
- ``turn_suffix(observation)``: what follows a finished assistant turn: closing the assistant
  message if the model did not (its end-of-turn token), the next user message, the next assistant
  header.

``native`` renders through ``tokenizer.apply_chat_template`` and derives the pieces from it by
rendering a conversation with a sentinel assistant message (so any HF chat template works);
named templates (``qwen2_5``, ``qwen2-vl`` for text, ``qwen3`` and ``qwen3_nothink``) are written
out explicitly. A template registry keeps them by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

__all__ = ["ChatTemplate", "get_template", "list_templates", "register_template"]

_SENTINEL = "\u2063RL_ROLLOUT_SENTINEL\u2063"


@dataclass(frozen=True)
class ChatTemplate:
    """Text pieces of a chat format.

    ``end_of_turn``: the text that closes an assistant message (e.g. ``<|im_end|>``); if generation
    stopped on it, it is already among the model's tokens and is not appended again.
    ``between_turns``: text after ``end_of_turn`` and before the next user message (e.g. ``\\n``).
    """

    name: str
    render_prefix: Callable[[list[dict[str, str]]], str]
    user_turn: Callable[[str], str]
    end_of_turn: str
    between_turns: str

    def prefix(self, messages: list[dict[str, str]]) -> str:
        return self.render_prefix(messages)

    def turn_suffix(self, observation: str, *, model_closed_turn: bool) -> str:
        head = "" if model_closed_turn else self.end_of_turn
        return head + self.between_turns + self.user_turn(observation)


def _qwen2_5(_tokenizer: Any) -> ChatTemplate:
    def render_prefix(messages: list[dict[str, str]]) -> str:
        out = []
        if not messages or messages[0]["role"] != "system":
            out.append("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
        out.extend(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        out.append("<|im_start|>assistant\n")
        return "".join(out)

    return ChatTemplate(
        name="qwen2_5",
        render_prefix=render_prefix,
        user_turn=lambda obs: f"<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n",
        end_of_turn="<|im_end|>",
        between_turns="\n",
    )


def _qwen2_vl(_tokenizer: Any) -> ChatTemplate:
    """Qwen2-VL's ChatML for text messages: the same text as ``qwen2_5`` (default system
    prompt, ``<|im_start|>role\n...<|im_end|>``). Image/video parts are not rendered: rows with
    image inputs are refused when the data loads (``rl_envs.tasks.data``), never dropped."""
    return replace(_qwen2_5(_tokenizer), name="qwen2-vl")


def _split_thinking(content: str) -> tuple[str, str]:
    """``(reasoning, answer)`` of an assistant message written as ``<think>R</think>A``."""
    if "</think>" not in content:
        return "", content
    head, _, answer = content.rpartition("</think>")
    reasoning = head.rstrip("\n").split("<think>")[-1].lstrip("\n")
    return reasoning, answer.lstrip("\n")


def _qwen3_message(message: dict[str, str], after_last_query: bool, last: bool) -> str:
    role, content = message["role"], message["content"]
    if role != "assistant":
        return f"<|im_start|>{role}\n{content}<|im_end|>\n"
    reasoning, answer = _split_thinking(content)
    reasoning = message.get("reasoning_content") or reasoning
    if after_last_query and (last or reasoning):
        body = f"<think>\n{reasoning.strip(chr(10))}\n</think>\n\n{answer}"
    else:
        body = answer
    return f"<|im_start|>assistant\n{body}<|im_end|>\n"


def _qwen3(_tokenizer: Any, *, enable_thinking: bool = True) -> ChatTemplate:
    """Qwen3's ChatML: no default system prompt; the reasoning (``<think>...</think>``) of an
    assistant message before the last user message is dropped, after it kept (the model's
    template's rule, so earlier turns cost no context); the generation prompt is
    ``<|im_start|>assistant\n`` (thinking on, as ROLL's ``qwen3`` renders it), with an empty
    ``<think>\n\n</think>\n\n`` block when ``enable_thinking`` is False."""
    think_off = "" if enable_thinking else "<think>\n\n</think>\n\n"

    def render_prefix(messages: list[dict[str, str]]) -> str:
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        last_query = users[-1] if users else -1
        last = len(messages) - 1
        out = [_qwen3_message(m, i > last_query, i == last) for i, m in enumerate(messages)]
        return "".join([*out, "<|im_start|>assistant\n", think_off])

    return ChatTemplate(
        name="qwen3" if enable_thinking else "qwen3_nothink",
        render_prefix=render_prefix,
        user_turn=lambda obs: (
            f"<|im_start|>user\n{obs}<|im_end|>\n<|im_start|>assistant\n" + think_off
        ),
        end_of_turn="<|im_end|>",
        between_turns="\n",
    )


def _native(tokenizer: Any) -> ChatTemplate:
    """Derive the pieces from ``tokenizer.apply_chat_template`` (text only, never the ids)."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("template 'native': the tokenizer has no chat_template")

    def render(messages: list[dict[str, str]], gen: bool) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)

    def render_prefix(messages: list[dict[str, str]]) -> str:
        return render(messages, True)

    base = [{"role": "user", "content": "x"}]
    with_gen = render(base, True)
    full = render([*base, {"role": "assistant", "content": _SENTINEL}], False)
    if not full.startswith(with_gen) or _SENTINEL not in full:
        raise ValueError(
            "template 'native': the chat template does not render an assistant message as "
            "generation prompt + content; use a named template"
        )
    close = full[full.index(_SENTINEL) + len(_SENTINEL) :]
    two = render(
        [
            *base,
            {"role": "assistant", "content": _SENTINEL},
            {"role": "user", "content": _SENTINEL},
        ],
        True,
    )
    after_assistant = two[two.index(_SENTINEL) + len(_SENTINEL) :]
    user_head, _, user_tail = after_assistant.partition(_SENTINEL)
    if not user_head.startswith(close):
        raise ValueError("template 'native': cannot find where an assistant message ends")
    eos = getattr(tokenizer, "eos_token", None) or ""
    if eos and close.startswith(eos):
        end_of_turn, between = eos, close[len(eos) :]
    else:
        end_of_turn, between = close, ""
    user_open = user_head[len(close) :]
    return ChatTemplate(
        name="native",
        render_prefix=render_prefix,
        user_turn=lambda obs: user_open + obs + user_tail,
        end_of_turn=end_of_turn,
        between_turns=between,
    )


_TEMPLATES: dict[str, Callable[[Any], ChatTemplate]] = {
    "native": _native,
    "qwen2_5": _qwen2_5,
    "qwen2-vl": _qwen2_vl,
    "qwen3": _qwen3,
    "qwen3_nothink": partial(_qwen3, enable_thinking=False),
}


def register_template(name: str, factory: Callable[[Any], ChatTemplate]) -> None:
    if name in _TEMPLATES:
        raise ValueError(f"chat template {name!r} is already registered")
    _TEMPLATES[name] = factory


def list_templates() -> list[str]:
    return sorted(_TEMPLATES)


def get_template(name: str, tokenizer: Any) -> ChatTemplate:
    if name not in _TEMPLATES:
        raise KeyError(f"unknown chat template {name!r}; known: {list_templates()}")
    return _TEMPLATES[name](tokenizer)
