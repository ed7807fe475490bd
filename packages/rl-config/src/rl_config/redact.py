"""Secret redaction and the resolved-config dump written next to a run's outputs."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import yaml

from rl_config.atomic_write import write_text_atomically

REDACTED = "***REDACTED***"
DUMP_NAME = "resolved_config.yaml"

_SECRET_WORDS = {
    "password",
    "passwd",
    "passphrase",
    "secret",
    "secrets",
    "credential",
    "credentials",
    "apikey",
    "cookie",
    "authorization",
    "auth",
}
_SECRET_PAIRS = {
    ("api", "key"),
    ("access", "key"),
    ("private", "key"),
    ("secret", "key"),
    ("client", "secret"),
    ("session", "key"),
    ("signing", "key"),
}
_URL_CREDENTIALS = re.compile(
    r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]+):(?P<pw>[^@/\s]+)@"
)


def _words(key: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def is_secret_key(key: str) -> bool:
    """True for keys that name secrets: api_key, WANDB_API_KEY, HF_TOKEN, password, client_secret...

    ``token`` counts only as the last word (``hf_token``, ``access_token``), so counters such as
    ``max_tokens_per_step`` or ``stop_token_ids`` are not redacted."""
    words = _words(key)
    if not words:
        return False
    if any(w in _SECRET_WORDS for w in words) or words[-1] == "token":
        return True
    return any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words))


def redact(data: Any) -> Any:
    """A copy of ``data`` with secret-named values replaced and URL passwords masked."""
    if isinstance(data, dict):
        out: dict[Any, Any] = {}
        for key, value in data.items():
            if isinstance(key, str) and is_secret_key(key) and value not in (None, ""):
                out[key] = REDACTED
            else:
                out[key] = redact(value)
        return out
    if isinstance(data, list):
        return [redact(v) for v in data]
    if isinstance(data, str):
        return _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", data)
    return data


def to_yaml(data: Any) -> str:
    """Block-style YAML, keys in schema order."""
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)


def dump_resolved(cfg: Any, out_dir: str | Path, filename: str = DUMP_NAME) -> Path:
    """Write the resolved config, secrets redacted, to ``out_dir/filename`` atomically.

    ``cfg`` is an ``ExperimentConfig`` (or a plain mapping). Returns the written path. The file
    loads back with ``load_config`` (redacted values become the literal ``***REDACTED***``).
    """
    data = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    text = "# resolved by rl-config; secrets redacted\n" + to_yaml(redact(data))
    return write_text_atomically(Path(out_dir) / filename, text)
