"""A run's throughput: trained samples (`rollout/num_trajectories`) per second of the training
loop, evaluation and checkpoints not counted (`throughput/samples_per_s` in the metrics,
summary.json's `throughput`). The totals are the whole run's, `"scope": "run"`: a checkpoint
carries them and a resumed run goes on from them (its rate includes the loop's seconds before the
interruption; the steps after the last checkpoint that were lost are counted once, as trained
again)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Throughput:
    samples_trained: float = 0.0
    loop_seconds: float = 0.0

    def add(self, samples: float, seconds: float) -> None:
        """One step of the training loop: `samples` trained in `seconds`."""
        self.samples_trained += samples
        self.loop_seconds += seconds

    def samples_per_s(self) -> float:
        """Trained samples per second of the run's training loop so far."""
        return self.samples_trained / self.loop_seconds if self.loop_seconds > 0 else 0.0

    def state(self) -> dict[str, float]:
        """The totals so far, as a checkpoint carries them."""
        return {"samples_trained": self.samples_trained, "loop_seconds": self.loop_seconds}

    def load_state(self, state: dict[str, Any] | None, checkpoint: str) -> None:
        """The totals from a checkpoint; one written before they were saved counts from the
        resume (said in a warning)."""
        if state is None:
            print(
                f"warning: checkpoint {checkpoint} records no throughput totals; "
                "throughput/samples_per_s and summary.json's throughput count from this resume",
                flush=True,
            )
            state = {}
        self.samples_trained = float(state.get("samples_trained", 0.0))
        self.loop_seconds = float(state.get("loop_seconds", 0.0))

    def summary(self) -> dict[str, Any]:
        """summary.json's `throughput`."""
        return {"scope": "run", "samples_per_s": self.samples_per_s(), **self.state()}
