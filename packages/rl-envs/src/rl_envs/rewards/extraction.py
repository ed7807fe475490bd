"""Answer extraction from model output: GSM8K ``####``, ``\\boxed{...}`` (nested braces) and
light normalisation. Pure string code: nothing is evaluated."""

from __future__ import annotations

import re

_HASH_RE = re.compile(r"####\s*([^\n]*)")
# a number: thousands groups only as 1,234,567 (so "1,2,3" is three numbers, not 123)
_NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUMBER_RE = re.compile(_NUMBER)
# what may stand between the numbers of a list: spaces, commas, semicolons, ellipses, or/and
_LIST_GAP_RE = re.compile(r"(?:\s*(?:[,;]|\.{2,}|…|\bor\b|\band\b)\s*|\s+)")


def all_hash_answers(text: str) -> list[str]:
    """The non-empty answers after every ``####`` (GSM8K), in order."""
    return [m.strip() for m in _HASH_RE.findall(text) if m.strip()]


def extract_hash_answer(text: str) -> str | None:
    """The text after the LAST ``####`` (GSM8K), stripped; None if absent."""
    matches = _HASH_RE.findall(text)
    if not matches:
        return None
    answer = matches[-1].strip()
    return answer or None


#: model output longer than this is not parsed in the trainer's process (no answer): every
#: parser here is linear, the bound keeps one response's cost small whatever it holds
MAX_PARSE_CHARS = 1 << 20
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\b")
_BARE_RE = re.compile(r"[^\s$]+")


def _closing_braces(text: str) -> dict[int, int]:
    """For each unescaped ``{`` that is closed, the index of its ``}`` (one pass, a stack)."""
    closing: dict[int, int] = {}
    stack: list[int] = []
    for match in re.finditer(r"(?<!\\)[{}]", text):
        if match.group() == "{":
            stack.append(match.start())
        elif stack:
            closing[stack.pop()] = match.start()
    return closing


def _box_at(text: str, i: int, closing: dict[int, int]) -> tuple[str, int] | None:
    """``(content, end)`` of the box whose argument starts at ``i`` (after ``\\boxed``)."""
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] == "{":
        j = closing.get(i)
        return None if j is None else (text[i + 1 : j], j + 1)  # None: unbalanced
    tail = _BARE_RE.match(text, i)
    return (tail.group(0), tail.end()) if tail else None


def all_boxed(text: str) -> list[str]:
    """Every ``\\boxed{...}``/``\\fbox{...}`` (balanced braces; ``\\boxed 5`` too) in order;
    a box nested in another is part of the outer one; unbalanced boxes are skipped. Linear in
    the text; none in a text longer than `MAX_PARSE_CHARS`."""
    if len(text) > MAX_PARSE_CHARS:
        return []
    found = []
    end = 0
    closing: dict[int, int] | None = None
    for match in _BOX_RE.finditer(text):
        if match.start() < end:
            continue
        if closing is None:
            closing = _closing_braces(text)
        box = _box_at(text, match.end(), closing)
        if box is not None:
            found.append(box[0])
            end = box[1]
    return found


def extract_boxed(text: str) -> str | None:
    """Content of the LAST ``\\boxed{...}`` or ``\\fbox{...}``, braces balanced; None if absent
    or unbalanced. ``\\boxed 5`` (no braces) is accepted too."""
    found = all_boxed(text)
    return found[-1] if found else None


def single_answer(candidates: list[str]) -> str | None:
    """The one final answer among ``candidates``: None if there is none or if they disagree
    (after ``normalize_answer``). Repeating the same answer is fine; hedging is not."""
    if not candidates:
        return None
    if len({normalize_answer(c) for c in candidates}) > 1:
        return None
    return candidates[-1]


def final_number(text: str) -> str | None:
    """GSM8K flexible answer: the last number, unless it ends a list of two or more different
    numbers (``"1 2 3 ... 10"``, ``"41, 42 or 43"``), which names no single answer."""
    matches = list(_NUMBER_RE.finditer(text))
    if not matches:
        return None
    run = [matches[-1].group(0)]
    for before, after in zip(reversed(matches[:-1]), reversed(matches[1:]), strict=True):
        if not _LIST_GAP_RE.fullmatch(text[before.end() : after.start()]):
            break
        run.append(before.group(0))
    if len({n.replace(",", "") for n in run}) > 1:
        return None
    return run[0].replace(",", "")


def normalize_answer(answer: str) -> str:
    """Canonical form for string comparison: no spaces, ``$``, ``\\!``, thousands commas,
    ``\\text{}`` wrappers, trailing period or ``.0``."""
    s = answer.strip()
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = (
        s.replace("\\%", "%")
        .replace("\\!", "")
        .replace("$", "")
        .replace("\\left", "")
        .replace("\\right", "")
    )
    s = s.replace("dfrac", "frac").replace("tfrac", "frac")
    s = re.sub(r"\s+", "", s).rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    if re.fullmatch(r"-?\d+\.0+", s):
        s = s.split(".")[0]
    return s


def to_number(answer: str) -> float | None:
    s = normalize_answer(answer)
    frac = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s)
    try:
        if frac:
            sign = -1.0 if frac.group(1) else 1.0
            return sign * float(frac.group(2)) / float(frac.group(3))
        if re.fullmatch(r"-?\d+/\d+", s):
            num, den = s.split("/")
            return float(num) / float(den)
        if s.endswith("%"):
            return float(s[:-1]) / 100.0
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None
