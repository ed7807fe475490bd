"""`rl-export CHECKPOINT OUT_DIR [--adapter] [--base-model DIR] [--role actor_train] [--key-file FILE]`:
a checkpoint -> a Hugging Face model directory (config.json, model.safetensors, tokenizer) that
`AutoModelForCausalLM.from_pretrained` loads, for every training backend (native and FSDP2:
torch.distributed.checkpoint; DeepSpeed ZeRO-0 to 3) and every pipeline. A LoRA role's
checkpoint exports as the merged model, or with `--adapter` as a peft adapter directory
(adapter_config.json, adapter_model.safetensors) that `peft.PeftModel.from_pretrained` loads on
the base model.

CHECKPOINT is a run's checkpoint (`<checkpoint dir>/step-<N>`), the directory holding them
(its newest valid one), or a training checkpoint of one role (`.../actor_train/step-<N>`, then
with --base-model). Everything is verified before it is read (rl_runtime.state.checkpoint: the run's
signed manifest; rl_train.checkpoint_export: the role's): a checkpoint directory is untrusted
input. The architecture, config and tokenizer come from the model the run started from (the
checkpoint records it, with the run's model config override), or from --base-model.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from rl_runtime.state.checkpoint import STATE_FILE, RunCheckpoints
from rl_train.checkpoint_store import dir_step

KeyFile = str | os.PathLike[str] | None
#: the run checkpoint's record of the model its policy started from (an absolute path)
MODEL_PATH_KEY = "model_path"
#: its record of each role's model config override (model_args.model_config_kwargs)
MODEL_CONFIG_KEY = "model_config_overrides"


def _role_checkpoint(path: Path) -> bool:
    """One role's trainer checkpoint, not a run's (which holds the run state and the roles)."""
    named = dir_step(path) is not None and not (path / STATE_FILE).is_file()
    return named or (path / "trainer_state.json").is_file()


def export_checkpoint(
    checkpoint: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    base_model: str | os.PathLike[str] | None = None,
    role: str = "actor_train",
    key_file: KeyFile = None,
    adapter: bool = False,
) -> Path:
    """Write the `role` model of `checkpoint` as an HF model directory `out_dir` (`adapter`:
    its LoRA adapter as a peft adapter directory); returns it. A
    :class:`~rl_train.signing.CheckpointError` names what does not verify."""
    from rl_train import checkpoint as train_ckpt
    from rl_train.checkpoint_export import checkpoint_weights, export_adapter_dir, export_weights
    from rl_train.signing import CheckpointError

    def write(found: Path, base: str | os.PathLike[str], overrides: Any = None) -> Path:
        if adapter:
            return export_adapter_dir(found, out_dir, base_model=base, key_file=key_file)
        weights = checkpoint_weights(found, key_file=key_file)
        return export_weights(weights, base, out_dir, config_overrides=overrides)

    path = Path(checkpoint)
    if _role_checkpoint(path):
        if base_model is None:
            raise ValueError(f"{path} is one role's checkpoint: give the model it was trained "
                             "from (--base-model)")  # fmt: skip
        return write(path, base_model)
    runs = RunCheckpoints(path, keep_last=None, key_file=key_file)
    run = runs.resolve(str(path))
    assert run is not None  # resolve raises when nothing verifies
    state = runs.load_state(run)
    found = train_ckpt.latest_checkpoint(run / role, key_file=key_file)
    if found is None:
        raise CheckpointError(f"checkpoint {run} holds no verified {role} checkpoint")
    base = base_model or state.extra.get(MODEL_PATH_KEY)
    if base is None:
        config = state.extra.get("config") or {}
        base = config.get("pretrain")
        if base is None or not (Path(str(base)) / "config.json").is_file():
            raise ValueError(
                f"checkpoint {run} does not say which model its run started from (pretrain: "
                f"{base!r}, not a local model directory from here): give it (--base-model)"
            )
    return write(found, str(base), (state.extra.get(MODEL_CONFIG_KEY) or {}).get(role))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rl-export",
        description="Write a checkpoint's model as a Hugging Face model directory.",
    )
    parser.add_argument("checkpoint", help="step-<N> of a run, or the directory holding them")
    parser.add_argument("out_dir", help="the HF model directory to write")
    parser.add_argument("--base-model", help="the model the run started from (config, tokenizer)")
    parser.add_argument("--role", default="actor_train", help="the role whose model to export")
    parser.add_argument("--key-file", help="the key that signed the checkpoint")
    parser.add_argument(
        "--adapter",
        action="store_true",
        help="a LoRA checkpoint's adapter as a peft adapter directory (not the merged model)",
    )
    args = parser.parse_args(argv)
    from rl_train.signing import CheckpointError

    try:
        out = export_checkpoint(args.checkpoint, args.out_dir, base_model=args.base_model,
                                role=args.role, key_file=args.key_file,
                                adapter=args.adapter)  # fmt: skip
    except CheckpointError as exc:
        print(f"checkpoint error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError) as exc:
        print(f"export error: {exc}", file=sys.stderr)
        return 1
    what = "adapter" if args.adapter else "model"
    print(f"exported {args.checkpoint} ({args.role} {what}) -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
