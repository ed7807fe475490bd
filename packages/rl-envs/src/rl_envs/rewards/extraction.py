"""Answer extraction from model output: GSM8K ``####``, ``\\boxed{...}`` (nested braces) and
light normalisation. Pure string code: nothing is evaluated."""

from __future__ import annotations

import re

_HASH_RE = re.compile(r"####\s*([^\n]*)")
_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_hash_answer(text: str) -> str | None:
    """The text after the LAST ``####`` (GSM8K), stripped; None if absent."""
    matches = _HASH_RE.findall(text)
    if not matches:
        return None
    answer = matches[-1].strip()
    return answer or None


def extract_boxed(text: str) -> str | None:
    """Content of the LAST ``\\boxed{...}`` or ``\\fbox{...}``, braces balanced; None if absent or
    unbalanced. ``\\boxed 5`` (no braces) is accepted too."""
    starts = [m.start() for m in re.finditer(r"\\(?:boxed|fbox)\b", text)]
    for start in reversed(starts):
        i = text.index("\\", start) + 1
        while i < len(text) and text[i].isalpha():
            i += 1
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{" and (j == 0 or text[j - 1] != "\\"):
                    depth += 1
                elif text[j] == "}" and text[j - 1] != "\\":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j]
            continue  # unbalanced: try an earlier one
        tail = re.match(r"[^\s$]+", text[i:])
        if tail:
            return tail.group(0)
    return None


def last_number(text: str) -> str | None:
    """The last number in the text (commas removed)."""
    matches = _NUMBER_RE.findall(text)
    return matches[-1].replace(",", "") if matches else None


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
