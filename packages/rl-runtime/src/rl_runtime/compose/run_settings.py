"""What every pipeline's run needs besides its science: cadence, checkpoints, tracker, cluster."""

from __future__ import annotations

from typing import Any

from rl_config.schema.pipeline import parse_record_steps
from rl_runtime.compose.components import (
    Cadence,
    CheckpointSettings,
    ClusterSettings,
    TrackerSettings,
)


def data_files(value: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """A `data_args.file_name`-style value (one path, a list of paths, or unset) as a tuple."""
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def build_cadence(cfg: Any) -> Cadence:
    return Cadence(
        max_steps=cfg.max_steps,
        logging_steps=cfg.logging_steps,
        eval_steps=cfg.eval_steps,
        save_steps=cfg.save_steps,
        record_steps=parse_record_steps(cfg.record_steps),
    )


def build_checkpoint(cfg: Any) -> CheckpointSettings:
    """checkpoint_config.output_dir, else `output_dir/checkpoints`."""
    directory = cfg.checkpoint_config.output_dir or f"{cfg.output_dir.rstrip('/')}/checkpoints"
    return CheckpointSettings(
        directory=directory,
        keep_last=cfg.max_ckpt_to_keep or None,
        resume=cfg.resume_from_checkpoint,
        key_file=cfg.checkpoint_config.key_file,
    )


def build_tracker(cfg: Any, warnings: list[str]) -> TrackerSettings:
    """The tracker's settings; appends a warning per `tracker_kwargs` key its backends ignore."""
    from rl_runtime.track.tracking import KWARGS_BACKENDS, unread_tracker_kwargs

    kwargs = dict(cfg.tracker_kwargs)
    warnings += [
        f"tracker_kwargs.{key}={kwargs[key]!r} has no effect: track_with {cfg.track_with!r} reads "
        f"only tracker_kwargs.log_dir (the other keys are for {', '.join(KWARGS_BACKENDS)})"
        for key in unread_tracker_kwargs(cfg.track_with, kwargs)
    ]
    return TrackerSettings(track_with=cfg.track_with, log_dir=cfg.logging_dir, kwargs=kwargs)


def build_cluster(cfg: Any, *, sync_bucket_bytes: int) -> ClusterSettings:
    """Devices (and the nodes they pin to), RPC bound, worker env and the weight sync's address
    and transport; `sync_bucket_bytes` 0 where no weights are synced."""
    return ClusterSettings(
        num_devices=cfg.num_nodes * cfg.num_gpus_per_node,
        rpc_timeout=float(cfg.rpc_timeout),
        system_envs=dict(cfg.system_envs),
        sync_bucket_bytes=sync_bucket_bytes,
        devices_per_node=cfg.num_gpus_per_node,
        node_resources=tuple(cfg.node_resources) if cfg.node_resources is not None else None,
        sync_host=cfg.weight_sync_host,
        sync_transport=cfg.weight_sync_transport,
    )
