"""Experiment loggers: a CSV logger always, Weights & Biases when configured.

W&B never blocks a run: with `mode: auto` it goes online only when an API key is known
and its server answers within a few seconds, otherwise it logs offline into the
experiment directory (sync later with `wandb sync`). `WANDB_MODE` in the environment
always wins.
"""

from __future__ import annotations

import logging
import netrc
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger

from asr.config_keys import check_choice
from asr.training.metrics_csv import CSV_DIR

log = logging.getLogger(__name__)

WANDB_MODES = ("auto", "online", "offline", "disabled")


@dataclass(frozen=True)
class WandbConfig:
    """Keys of `logger.wandb` (`WandbLogger`'s arguments, and `mode`).

    - `mode`: `auto` (online when an API key is known and the server answers, else
      offline), `online`, `offline` or `disabled`; `WANDB_MODE` in the environment wins.
    - `project`: the W&B project.
    - `name`: the run's name (null: the name of `exp_dir`).
    - `entity`: the W&B user or team (null: the key's default).
    """

    mode: str = "auto"
    project: str = "asr"
    name: str | None = None
    entity: str | None = None


@dataclass(frozen=True)
class LoggerConfig:
    """Keys of the `logger` group.

    - `csv`: write `metrics.csv` under `exp_dir/csv` (one version per run and resume).
    - `wandb`: log to Weights & Biases too (`WandbConfig`; null: not).
    """

    csv: bool = True
    wandb: WandbConfig | None = field(default_factory=WandbConfig)


def _has_wandb_key(host: str) -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def _reachable(host: str, port: int = 443, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def resolve_wandb_mode(mode: str) -> str:
    """The W&B mode to use: `WANDB_MODE` if set, else `mode`, with `auto` resolved."""
    check_choice("logger.wandb.mode", mode, WANDB_MODES)
    env = os.environ.get("WANDB_MODE")
    if env:
        return env
    if mode != "auto":
        return mode
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or ""
    if not _has_wandb_key(host):
        log.info("W&B: no API key found, logging offline (wandb sync later to upload)")
        return "offline"
    if not _reachable(host):
        log.warning("W&B: %s unreachable, logging offline", host)
        return "offline"
    return "online"


def build_loggers(config: LoggerConfig, save_dir: str | Path, run_config: dict) -> list[Logger]:
    """CSV logger (if `csv`) plus a WandbLogger from `config.wandb` (if not null); W&B
    records `run_config` as the run's hyper-parameters."""
    save_dir = Path(save_dir)
    loggers: list[Logger] = []
    if config.csv:
        # One version_N directory per run and per resume: with a fixed directory Lightning
        # deletes the previous metrics.csv when a resumed run starts logging.
        loggers.append(CSVLogger(save_dir, name=CSV_DIR))
    wandb = config.wandb
    if wandb is not None:
        mode = resolve_wandb_mode(wandb.mode)
        if mode != "disabled":
            os.environ["WANDB_MODE"] = mode  # also seen by wandb's own service process
            os.environ.setdefault("WANDB_SILENT", "true")
            logger = WandbLogger(
                save_dir=str(save_dir),
                offline=mode == "offline",
                project=wandb.project,
                name=wandb.name or save_dir.name,
                entity=wandb.entity,
            )
            logger.log_hyperparams(run_config)
            loggers.append(logger)
    return loggers
