"""The one exception type of rl-config: every problem found in a config, reported together."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigIssue:
    """One problem: ``path`` is the dotted key (``actor_train.training_args.learning_rate``, or ``""``
    for the whole config); ``message`` says what is wrong and how to fix it; ``origin`` where the
    value came from when not from the file (``command line: key=value``)."""

    path: str
    message: str
    origin: str = ""

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}" if self.path else self.message
        return f"{text} (from the {self.origin})" if self.origin else text


class ConfigError(ValueError):
    """A config could not be loaded or is invalid.

    ``issues`` lists every problem found (all of them, not just the first); ``source`` names the
    file when there is one. ``str(error)`` is a readable multi-line report.
    """

    def __init__(self, issues: list[ConfigIssue] | ConfigIssue | str, source: str | None = None):
        if isinstance(issues, str):
            issues = [ConfigIssue("", issues)]
        elif isinstance(issues, ConfigIssue):
            issues = [issues]
        self.issues: list[ConfigIssue] = list(issues)
        self.source = source
        super().__init__(self._render())

    def with_source(self, source: str) -> ConfigError:
        """The same issues, attributed to ``source`` (a file path)."""
        return ConfigError(self.issues, source=source)

    def _render(self) -> str:
        n = len(self.issues)
        where = f" in {self.source}" if self.source else ""
        head = f"invalid config{where} ({n} error{'s' if n != 1 else ''}):"
        lines = [head]
        for issue in self.issues:
            text = str(issue).replace("\n", "\n    ")
            lines.append(f"  - {text}")
        return "\n".join(lines)
