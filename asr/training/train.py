"""`asr-train`: build everything from the Hydra config, fit, then test the best checkpoint.

    asr-train experiment=demo trainer.max_epochs=2 model.encoder.num_layers=4
    asr-train experiment=demo --cfg job --resolve   # print the resolved config and exit

Outputs go to `exp_dir`: checkpoints/, csv/version_N/ (metrics, one version per run or
resume), wandb/, hydra/ (the config used).
Running the same command again resumes from `exp_dir/checkpoints/last.ckpt` (`resume=auto`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from asr.cli import command
from asr.config_keys import dataclass_from_keys
from asr.data.datamodule import AsrDataModule
from asr.data.tokenizer import Tokenizer
from asr.decoding.search import default_options
from asr.inference.bundle import BEST_CHECKPOINT, CHECKPOINT_DIR
from asr.models.build import build_model, count_parameters, model_config
from asr.training.callbacks import EmaConfig, EmaWeights
from asr.training.checkpointing import (
    RESUME_CHECKPOINT,
    AtomicCheckpointIO,
    checkpoint_callbacks,
)
from asr.training.cuda_allocator import use_expandable_segments
from asr.training.distributed.adascale import AdaScaleLearningRate
from asr.training.distributed.adpsgd import DecentralizedStrategy, GossipMonitor
from asr.training.distributed.ddp import (
    DistributedConfig,
    build_strategy,
    is_peer_failure,
    processes_per_node,
    set_cpu_threads,
    uses_cpu,
)
from asr.training.distributed.dgc_adam import check_variance_freeze
from asr.training.distributed.dgc_monitor import CompressionMonitor
from asr.training.distributed.dgc_state import AdamMoments
from asr.training.distributed.straggler import Straggler
from asr.training.loggers import build_loggers
from asr.training.module import AsrLitModule
from asr.training.objective import build_objective, first_full_loss_step
from asr.training.optimizer import optim_config
from asr.training.precision import enlarge_onednn_cache, resolve_precision
from asr.training.schedules import schedule_function
from asr.training.step_guard import FaultConfig
from asr.training.step_times import StepTimes

log = logging.getLogger("asr.train")

# The configs ship inside the package (asr/configs), so any install finds them;
# ASR_CONFIG_DIR points elsewhere, and Hydra's --config-dir adds a directory.
CONFIG_DIR = os.environ.get("ASR_CONFIG_DIR", str(Path(__file__).resolve().parents[1] / "configs"))


def resume_path(cfg: DictConfig, ckpt_dir: Path) -> str | None:
    """`resume`: auto (last.ckpt if present), false/null (fresh), or a checkpoint path."""
    resume = cfg.resume
    if resume in (None, False, "false", "none"):
        return None
    if resume == "auto":
        last = ckpt_dir / RESUME_CHECKPOINT
        return str(last) if last.is_file() else None
    if not Path(resume).is_file():
        raise FileNotFoundError(f"resume={resume}: no such checkpoint")
    return str(resume)


def estimate_total_steps(trainer: L.Trainer, datamodule: AsrDataModule) -> int:
    """Optimizer steps of the run: `max_steps`, or batches per epoch x epochs / accumulation."""
    if trainer.max_steps and trainer.max_steps > 0:
        return trainer.max_steps
    batches = datamodule.count_train_batches(trainer.global_rank, trainer.world_size)
    epochs = trainer.max_epochs or 1
    return max(1, batches * epochs // trainer.accumulate_grad_batches)


def build(cfg: DictConfig) -> tuple[L.Trainer, AsrLitModule, AsrDataModule]:
    """Instantiate tokenizer, model, objective, data, loggers and trainer from `cfg`.
    Every config section is read into its typed config before any file is opened, so a
    mistyped key fails at once."""
    model_cfg: dict[str, Any] = OmegaConf.to_container(cfg.model, resolve=True)
    objective = build_objective(model_cfg.get("kind", "transducer"), model_cfg.pop("loss", None))
    model_parts = model_config(model_cfg)
    optim = optim_config(OmegaConf.to_container(cfg.optim, resolve=True))
    faults = FaultConfig.from_mapping(cfg.get("faults"))
    distributed = DistributedConfig.from_mapping(cfg.get("distributed"))
    data_cfg = OmegaConf.to_container(cfg.data, resolve=True)
    datamodule = AsrDataModule(**data_cfg)
    tokenizer = Tokenizer.load(cfg.data.tokenizer)
    model = build_model(model_parts, tokenizer.vocab_size)
    log.info("model: %s parameters", f"{count_parameters(model):,}")

    exp_dir = Path(cfg.exp_dir)
    ckpt_dir = exp_dir / CHECKPOINT_DIR
    run_config = OmegaConf.to_container(cfg, resolve=True)
    trainer_cfg: dict[str, Any] = OmegaConf.to_container(cfg.trainer, resolve=True)
    trainer_cfg["precision"] = resolve_precision(
        trainer_cfg["precision"], trainer_cfg["accelerator"]
    )
    log.info("precision: %s", trainer_cfg["precision"])
    world_size = processes_per_node(trainer_cfg["accelerator"], trainer_cfg["devices"])
    world_size *= int(trainer_cfg.get("num_nodes", 1))
    if uses_cpu(trainer_cfg["accelerator"]):
        set_cpu_threads(distributed, world_size)
    strategy = build_strategy(
        trainer_cfg.pop("strategy"),
        world_size=world_size,
        config=distributed,
        parts_without_gradient=objective.parts_without_gradient(model),
        loss_kind=getattr(objective.config, "kind", None),
        optimizer_momentum=optim.sgd_momentum,
        adam_moments=AdamMoments(*optim.betas, optim.eps) if optim.kind == "adamw" else None,
    )
    compression = getattr(strategy, "compression", None)
    if compression is not None and compression.freezes_variance:
        check_variance_freeze(compression.config, first_full_loss_step(objective))
    if compression is not None and trainer_cfg.get("gradient_clip_val"):
        # DGC clips each rank's gradient before accumulation, in the hook, instead of the
        # exchanged sum (which holds accumulated values, or already Adam's directions).
        if compression.config.clip_norm is None:
            clip = float(trainer_cfg["gradient_clip_val"])
            compression.config = dataclasses.replace(compression.config, clip_norm=clip)
        trainer_cfg["gradient_clip_val"] = None
        log.info(
            "gradient clipping moves into the DGC hook: clip_norm=%s", compression.config.clip_norm
        )
    callbacks = [
        *checkpoint_callbacks(ckpt_dir, cfg.checkpoint.every_n_train_steps),
        L.pytorch.callbacks.LearningRateMonitor(logging_interval="step"),
        L.pytorch.callbacks.RichProgressBar(),
    ]
    if cfg.get("ema"):
        callbacks.append(EmaWeights(dataclass_from_keys(EmaConfig, cfg.ema, "ema")))
    if getattr(strategy, "compression", None) is not None:
        callbacks.append(CompressionMonitor(strategy.compression))
    if isinstance(strategy, DecentralizedStrategy):
        callbacks.append(GossipMonitor(strategy))
    debug = cfg.get("debug") or {}
    if debug.get("straggler_rank") is not None:
        callbacks.append(Straggler(int(debug.straggler_rank), float(debug.straggler_slowdown)))
    if debug.get("step_times_dir"):
        callbacks.append(StepTimes(debug.step_times_dir))
    trainer = L.Trainer(
        **trainer_cfg,
        strategy=strategy,
        default_root_dir=exp_dir,
        logger=build_loggers(cfg.logger, exp_dir, run_config),
        callbacks=callbacks,
        plugins=[AtomicCheckpointIO()],
        use_distributed_sampler=False,  # the bucketing sampler splits data across ranks itself
    )
    needs_total = optim.scheduler is not None and optim.scheduler.kind == "warmup_cosine"
    total_steps = estimate_total_steps(trainer, datamodule) if needs_total else None
    if getattr(strategy, "adascale", None) is not None:
        if optim.kind != "sgd":
            raise ValueError("distributed.adascale is for momentum SGD: set optim=sgd_cosine")
        # The schedule is the one-rank run's, in steps of one rank's batch.
        one_rank_steps = total_steps * world_size if total_steps else None
        schedule = (
            schedule_function(optim.scheduler, one_rank_steps)
            if optim.scheduler is not None
            else lambda _: 1.0
        )
        trainer.callbacks.append(AdaScaleLearningRate(strategy.adascale, schedule, one_rank_steps))
    module = AsrLitModule(
        model,
        objective,
        tokenizer,
        optim=optim,
        bundle_meta={"model": model_cfg, "features": data_cfg.get("features") or {}},
        total_steps=total_steps,
        faults=faults,
        search=default_options(model, int(cfg.get("validation_beam_size", 1))),
    )
    return trainer, module, datamodule


def run(cfg: DictConfig) -> dict[str, float]:
    """Fit (resuming if asked), then test the best checkpoint. Returns final metrics."""
    enlarge_onednn_cache()
    L.seed_everything(cfg.seed, workers=True)
    torch.set_float32_matmul_precision("high")
    trainer, module, datamodule = build(cfg)
    ckpt_dir = Path(cfg.exp_dir) / CHECKPOINT_DIR
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_path(cfg, ckpt_dir))
    except Exception as err:
        if trainer.world_size > 1 and is_peer_failure(err):
            raise RuntimeError(
                f"rank {trainer.global_rank} of {trainer.world_size} lost contact with the other "
                f"processes ({type(err).__name__}): one of them died or hung (its own log says "
                f"why; a hung one is given up after distributed.timeout="
                f"{cfg.distributed.timeout} s). Run the same command again to resume from "
                f"{ckpt_dir / RESUME_CHECKPOINT}."
            ) from err
        raise
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    if cfg.run_test and datamodule.test_cuts:
        best = ckpt_dir / BEST_CHECKPOINT
        results = trainer.test(
            module, datamodule=datamodule, ckpt_path=str(best) if best.is_file() else None
        )
        metrics.update(results[0] if results else {})
    if trainer.is_global_zero:
        summary = {k: round(v, 4) for k, v in sorted(metrics.items()) if "/" in k}
        log.info("final metrics: %s", summary)
    return metrics


@hydra.main(config_path=CONFIG_DIR, config_name="train", version_base="1.3")
@command
def main(cfg: DictConfig) -> None:
    use_expandable_segments()  # before anything touches CUDA
    run(cfg)


if __name__ == "__main__":
    main()
