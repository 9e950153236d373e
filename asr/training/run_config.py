"""The keys of `asr/configs/train.yaml` that `asr-train` reads itself, and the `trainer`
group it hands to `lightning.Trainer`: their schema, defaults and documentation, and the
readers that turn a composed config into them (`read_run_config`, `read_trainer_config`).

`asr.training.config_files` writes `train.yaml` and `trainer/default.yaml` from these
dataclasses, as it writes every other group file from its part's config dataclass.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import lightning as L

from asr.config_keys import ConfigError, config_keys, dataclass_from_keys
from asr.training.distributed.config import DistributedConfig
from asr.training.step_guard import FaultConfig

# The top-level keys of train.yaml that hold a part's own section, each read by that part's
# config (model, data, optimizer, trainer, logger, EMA); every other top-level key is a
# `RunConfig` field. Not the list of Hydra's config groups: `distributed` is a group whose
# keys `RunConfig` reads, and `experiment` a group that only sets keys of the others.
SECTION_KEYS = ("model", "data", "trainer", "optim", "logger", "ema")
# lightning.Trainer arguments that asr-train sets itself: not for the trainer group.
SET_BY_ASR_TRAIN = (
    "logger",
    "callbacks",
    "plugins",
    "default_root_dir",
    "use_distributed_sampler",
)


@dataclass(frozen=True)
class CheckpointConfig:
    """Keys of `checkpoint` (`asr.training.checkpointing.checkpoint_callbacks`).

    - `every_n_train_steps`: also refresh `last.ckpt` every N optimizer steps, so that a
      stopped run resumes inside the epoch (null: at epoch ends only).
    """

    every_n_train_steps: int | None = None


@dataclass(frozen=True)
class DebugConfig:
    """Keys of `debug`: measurements of multi-process training.

    - `straggler_rank`: make this rank slower
      (`asr.training.distributed.communication.straggler`): each step it sleeps
      (slowdown - 1) x its own step time (null: none).
    - `straggler_slowdown`: how many times slower the straggler is (>= 1).
    - `step_times_dir`: each rank appends (step, time, audio seconds, step seconds and,
      under plain DDP, its wait in the gradient all-reduce) to `DIR/rank<R>.jsonl`
      (`asr.training.step_times`; null: not recorded).
    """

    straggler_rank: int | None = None
    straggler_slowdown: float = 2.0
    step_times_dir: str | None = None


@dataclass(frozen=True)
class RunConfig:
    """The run-level keys of `train.yaml` (beside its groups).

    - `seed`: of every random number generator (Lightning's `seed_everything`, the sampler).
    - `data_dir`: where `manifests/` and `tokenizer/` live.
    - `exp_dir`: checkpoints, logs and the config used go here (presets set their own).
    - `resume`: `auto` (continue from `exp_dir/checkpoints/last.ckpt` if present), false or
      null (start afresh), or a checkpoint's path.
    - `init_from`: start the whole model from this trained one (a bundle or `asr-train`
      checkpoint of the same kind and size); a full-context model's convolutions are made
      causal for a streaming one (docs/streaming.md); null: random.
    - `init_encoder_from`: start the encoder from this pre-training checkpoint, other
      checkpoint or encoder export (`asr-export --encoder-only`); null: random (docs/ssl.md).
    - `freeze_encoder_steps`: keep the encoder unchanged for this many optimizer steps.
    - `encoder_lr_scale`: the encoder's learning rate is the schedule's times this
      (fine-tuning: below 1 trains a pre-trained encoder slower than the new head).
    - `run_test`: test the best checkpoint on `data.test_cuts` after fitting.
    - `validation_beam_size`: the search of validation and the final test: 1 greedy, more
      beam search.
    - `checkpoint`: when `last.ckpt` is written (`CheckpointConfig`).
    - `distributed`: multi-process runs (`trainer.strategy=ddp` or `adpsgd`;
      docs/distributed.md).
    - `faults`: what stops a run instead of being skipped.
    - `debug`: measurements of multi-process training (`DebugConfig`).
    """

    seed: int = 42
    data_dir: str = "data"
    exp_dir: str = "exp/default"
    resume: str | bool | None = "auto"
    init_from: str | None = None
    init_encoder_from: str | None = None
    freeze_encoder_steps: int = 0
    encoder_lr_scale: float = 1.0
    run_test: bool = True
    validation_beam_size: int = 1
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)


@dataclass(frozen=True)
class TrainerConfig:
    """Keys of the `trainer` group: `lightning.Trainer`'s arguments of the same names.

    - `accelerator`: `auto`, `cpu` or `gpu`.
    - `devices`: processes per node: a number, -1 or `auto` (every GPU, or one CPU process).
    - `num_nodes`: machines of a multi-node run.
    - `strategy`: `auto`, `ddp` or `adpsgd` (decentralized; docs/adpsgd.md); fsdp is not supported.
    - `precision`: `32-true`, `bf16-mixed`, ..., or `auto`: bf16-mixed where the device has
      native bf16 (recent GPUs, CPUs with AVX512-BF16 or AMX), else 32-true.
    - `max_epochs`: epochs of the run.
    - `max_steps`: optimizer steps of the run (-1: as many as `max_epochs` make).
    - `max_time`: stop training at this wall time, e.g. "00:12:00:00" (DD:HH:MM:SS; null: no
      limit).
    - `gradient_clip_val`: clip the gradient's norm to this (null: no clipping).
    - `accumulate_grad_batches`: mini-batches per optimizer step.
    - `log_every_n_steps`: how often training metrics are logged.
    - `num_sanity_val_steps`: validation batches run before training.
    - `check_val_every_n_epoch`: validate after every N epochs.
    - `deterministic`: deterministic algorithms only (slower).
    """

    accelerator: str = "auto"
    devices: int | str = "auto"
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"
    max_epochs: int = 30
    max_steps: int = -1
    max_time: str | None = None
    gradient_clip_val: float | None = 5.0
    accumulate_grad_batches: int = 1
    log_every_n_steps: int = 20
    num_sanity_val_steps: int = 0
    check_val_every_n_epoch: int = 1
    deterministic: bool = False


def read_run_config(cfg: Mapping[str, Any]) -> RunConfig:
    """The run-level keys of a composed `train.yaml` config (all but its `SECTION_KEYS`) as a
    `RunConfig`; an unknown key is an error that names it."""
    keys = {key: value for key, value in cfg.items() if key not in SECTION_KEYS}
    unknown = sorted(set(keys) - set(config_keys(RunConfig)))
    if unknown:
        raise ConfigError(
            f"unknown config key {', '.join(unknown)}; valid top-level keys: "
            f"{sorted([*config_keys(RunConfig), *SECTION_KEYS])}"
        )
    keys["distributed"] = DistributedConfig.from_mapping(keys.get("distributed"))
    keys["faults"] = FaultConfig.from_mapping(keys.get("faults"))
    keys["checkpoint"] = dataclass_from_keys(CheckpointConfig, keys.get("checkpoint"), "checkpoint")
    keys["debug"] = dataclass_from_keys(DebugConfig, keys.get("debug"), "debug")
    return RunConfig(**keys)


def read_trainer_config(cfg: Mapping[str, Any]) -> tuple[TrainerConfig, dict[str, Any]]:
    """The `trainer` group: its declared keys as a `TrainerConfig`, and the other
    `lightning.Trainer` arguments a user added (`+trainer.val_check_interval=100`), passed
    on as they are. A key that is neither is an error that names it."""
    declared = set(config_keys(TrainerConfig))
    extra = {key: value for key, value in cfg.items() if key not in declared}
    arguments = set(inspect.signature(L.Trainer.__init__).parameters) - {"self"}
    unknown = sorted(key for key in extra if key not in arguments or key in SET_BY_ASR_TRAIN)
    if unknown:
        raise ConfigError(
            f"unknown config key {', '.join(f'trainer.{key}' for key in unknown)}: neither a "
            f"key of the trainer group ({sorted(declared)}) nor a lightning.Trainer argument "
            f"that asr-train leaves to you (it sets {list(SET_BY_ASR_TRAIN)} itself)"
        )
    declared_keys = {key: value for key, value in cfg.items() if key in declared}
    return dataclass_from_keys(TrainerConfig, declared_keys, "trainer"), extra


def trainer_arguments(trainer: TrainerConfig, extra: Mapping[str, Any]) -> dict[str, Any]:
    """`lightning.Trainer`'s arguments from the trainer group, but `precision` and
    `strategy`, which asr-train resolves first."""
    arguments = {f.name: getattr(trainer, f.name) for f in dataclasses.fields(trainer)}
    del arguments["precision"], arguments["strategy"]
    return arguments | dict(extra)
