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
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from asr.config_keys import ConfigError, dataclass_from_keys
from asr.data.datamodule import AsrDataModule
from asr.data.feature_stats import read_feature_stats
from asr.data.tokenizer import Tokenizer
from asr.decoding.search import default_options
from asr.inference.bundle import BEST_CHECKPOINT, CHECKPOINT_DIR
from asr.losses.lattice_choice import active_lattice
from asr.models.build import build_model, count_parameters, model_config, model_kind
from asr.training.callbacks import EmaConfig, EmaWeights
from asr.training.checkpointing import (
    RESUME_CHECKPOINT,
    AtomicCheckpointIO,
    checkpoint_callbacks,
)
from asr.training.distributed.ddp import is_peer_failure, uses_cpu
from asr.training.distributed.setup import DistributedSetup, TrainingFacts, setup_distributed
from asr.training.encoder_init import load_encoder, load_model_weights
from asr.training.loggers import LoggerConfig, build_loggers
from asr.training.module import AsrLitModule
from asr.training.objective import Objective, build_objective, first_full_loss_step
from asr.training.optimizer import OptimConfig, optim_config
from asr.training.precision import emulated_bf16, enlarge_onednn_cache, resolve_precision
from asr.training.run_config import (
    DebugConfig,
    RunConfig,
    TrainerConfig,
    read_run_config,
    read_trainer_config,
    trainer_arguments,
)

log = logging.getLogger("asr.train")


def resume_path(resume: str | bool | None, ckpt_dir: Path) -> str | None:
    """`resume`: auto (last.ckpt if present), false/null (fresh), or a checkpoint path."""
    if resume in (None, False, "false", "none"):
        return None
    if resume == "auto":
        last = ckpt_dir / RESUME_CHECKPOINT
        return str(last) if last.is_file() else None
    if not Path(str(resume)).is_file():
        raise FileNotFoundError(f"resume={resume}: no such checkpoint")
    return str(resume)


def estimate_total_steps(trainer: L.Trainer, datamodule: AsrDataModule) -> int:
    """Optimizer steps of the run: `max_steps`, or batches per epoch x epochs / accumulation."""
    if trainer.max_steps and trainer.max_steps > 0:
        return trainer.max_steps
    batches = datamodule.count_train_batches(trainer.global_rank, trainer.world_size)
    epochs = trainer.max_epochs or 1
    return max(1, batches * epochs // trainer.accumulate_grad_batches)


class Built(NamedTuple):
    """What `build` makes: the trainer, the module, the data, and what the config's
    `auto`/null keys resolved to (written to `hydra/resolved.yaml`)."""

    trainer: L.Trainer
    module: AsrLitModule
    datamodule: AsrDataModule
    resolved: dict[str, Any]


def build(cfg: DictConfig) -> Built:
    """Instantiate tokenizer, model, objective, data, loggers and trainer from `cfg`.
    Every config section is read into its typed config before any file is opened, so a
    mistyped key fails at once: the run-level keys into `RunConfig`, the trainer group into
    `TrainerConfig`, the others by their parts (model, loss, optimizer, data, logger, EMA)."""
    container: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)
    run = read_run_config(container)
    trainer_config, lightning_extra = read_trainer_config(container["trainer"])
    model_cfg: dict[str, Any] = dict(container["model"])  # without its loss below
    objective = build_objective(model_kind(model_cfg), model_cfg.pop("loss", None))
    model_parts = model_config(model_cfg)
    optim = optim_config(container["optim"])
    logger = dataclass_from_keys(LoggerConfig, container["logger"], "logger")
    ema = container.get("ema")  # the group is optional: no key when it selects nothing
    ema_config = None if ema is None else dataclass_from_keys(EmaConfig, ema, "ema")
    datamodule = data_module(container["data"], pretraining=model_parts.kind == "ssl")
    tokenizer, model = build_network(run, model_parts, datamodule)
    exp_dir = Path(run.exp_dir)
    accelerator = trainer_config.accelerator
    precision = resolve_precision(trainer_config.precision, accelerator)
    log.info("precision: %s", precision)
    if emulated_bf16(precision, accelerator):
        log.warning(
            "trainer.precision=%s on a CPU without AVX512-BF16 or AMX: bf16 is emulated, "
            "slower than 32-true, and oneDNN's LSTM may refuse it",
            precision,
        )
    facts = training_facts(trainer_config, run.debug, objective, model, optim)
    parallel = setup_distributed(run.distributed, facts)
    trainer = L.Trainer(
        **trainer_arguments(trainer_config, lightning_extra),
        strategy=parallel.strategy,
        precision=precision,
        default_root_dir=exp_dir,
        logger=build_loggers(logger, exp_dir, container),
        callbacks=[*run_callbacks(run, ema_config, tokenizer is None), *parallel.callbacks],
        plugins=[AtomicCheckpointIO()],
        use_distributed_sampler=False,  # the bucketing sampler splits data across ranks itself
    )
    needs_total = optim.scheduler is not None and optim.scheduler.kind == "warmup_cosine"
    features = dataclasses.asdict(datamodule.features)
    module = AsrLitModule(
        model,
        objective,
        tokenizer,
        optim=optim,
        bundle_meta={"model": model_cfg, "features": features},
        # counted when fitting starts: the ranks agree on every step of an epoch
        count_total_steps=partial(estimate_total_steps, trainer, datamodule)
        if needs_total
        else None,
        faults=run.faults,
        search=None if tokenizer is None else default_options(model, run.validation_beam_size),
        strategy_features=parallel.strategy_features,
        freeze_encoder_steps=run.freeze_encoder_steps,
        encoder_lr_scale=run.encoder_lr_scale,
    )
    resolved = resolved_keys(precision, objective, accelerator, parallel)
    return Built(trainer, module, datamodule, resolved)


def training_facts(
    trainer: TrainerConfig,
    debug: DebugConfig,
    objective: Objective,
    model: torch.nn.Module,
    optim: OptimConfig,
) -> TrainingFacts:
    """What `setup_distributed` needs from the trainer keys, objective, optimizer, debug."""
    return TrainingFacts(
        trainer=trainer,
        optim=optim,
        parts_without_gradient=tuple(objective.parts_without_gradient(model)),
        loss_kind=getattr(objective.config, "kind", None),
        first_full_loss_step=first_full_loss_step(objective),
        debug=debug,
    )


def data_module(data_cfg: dict[str, Any], pretraining: bool) -> AsrDataModule:
    """The `data` group as the run's `AsrDataModule`. Pre-training reads audio alone: its
    tokenizer, if one is named, is not used."""
    datamodule = AsrDataModule(**data_cfg)
    if pretraining and datamodule.tokenizer_path:
        log.info(
            "data.tokenizer=%s is not used: pre-training reads audio alone",
            datamodule.tokenizer_path,
        )
        datamodule = AsrDataModule(**{**data_cfg, "tokenizer": None})
    return datamodule


def build_network(
    run: RunConfig, model_parts: Any, datamodule: AsrDataModule
) -> tuple[Tokenizer | None, torch.nn.Module]:
    """The tokenizer (None for pre-training) and the model, its encoder from
    `init_encoder_from` if set."""
    tokenizer = datamodule.tokenizer
    if tokenizer is None and model_parts.kind != "ssl":
        raise ConfigError("data.tokenizer is null: only pre-training (model.kind=ssl) runs without")
    model = build_model(model_parts, None if tokenizer is None else tokenizer.vocab_size)
    log.info("model: %s parameters", f"{count_parameters(model):,}")
    stats_path = model_parts.encoder.feature_stats
    if stats_path is not None:
        if datamodule.features.normalize != "none":
            raise ConfigError(
                f"model.encoder.feature_stats={stats_path} normalizes inside the model: set "
                f"data.features.normalize=none (it is {datamodule.features.normalize})"
            )
        model.encoder.set_feature_stats(
            *read_feature_stats(stats_path, model.encoder.config.input_dim)
        )
        log.info("encoder: feature statistics from %s", stats_path)
    if run.init_from and run.init_encoder_from:
        raise ConfigError("init_from starts the whole model: leave init_encoder_from null")
    if run.init_from:
        loaded = load_model_weights(model, run.init_from)
        log.info("model: %d tensors from %s", loaded, run.init_from)
    if run.init_encoder_from:
        loaded = load_encoder(model.encoder, run.init_encoder_from)
        log.info("encoder: %d tensors from %s", loaded, run.init_encoder_from)
    return tokenizer, model


def run_callbacks(
    run: RunConfig, ema: EmaConfig | None = None, pretraining: bool = False
) -> list[L.Callback]:
    """Checkpoints (`best.ckpt` by validation WER, or by the loss for pre-training), the
    learning-rate monitor, the progress bar and EMA (the `debug` keys' callbacks come from
    `setup_distributed`)."""
    ckpt_dir = Path(run.exp_dir) / CHECKPOINT_DIR
    monitor = "val/loss" if pretraining else "val/wer"
    callbacks = [
        *checkpoint_callbacks(ckpt_dir, run.checkpoint.every_n_train_steps, monitor),
        L.pytorch.callbacks.LearningRateMonitor(logging_interval="step"),
        L.pytorch.callbacks.RichProgressBar(),
    ]
    if ema is not None:
        callbacks.append(EmaWeights(ema))
    return callbacks


def resolved_keys(
    precision: str, objective: Objective, accelerator: str, parallel: DistributedSetup
) -> dict[str, Any]:
    """What the keys left to `auto`/null resolved to in this run, by config section."""
    resolved: dict[str, Any] = {"trainer": {"precision": precision}}
    loss = objective.config
    if getattr(loss, "kind", None) == "samplewise":
        device = torch.device("cpu" if uses_cpu(accelerator) else "cuda")
        resolved["model"] = {"loss": {"lattice": active_lattice(loss.lattice, device)}}
    resolved["distributed"] = parallel.resolved
    return resolved


def write_resolved(resolved: dict[str, Any], exp_dir: Path) -> Path:
    """`resolved` as `resolved.yaml` beside the `config.yaml` Hydra saved for this run
    (`exp_dir/hydra/.hydra/`; `exp_dir/hydra/` when run without Hydra), atomically."""
    folder = exp_dir / "hydra"
    if HydraConfig.initialized():
        hydra = HydraConfig.get()
        folder = Path(hydra.runtime.output_dir) / (hydra.output_subdir or "")
    path = folder / "resolved.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".yaml.partial")
    partial.write_text(OmegaConf.to_yaml(OmegaConf.create(resolved)))
    partial.replace(path)
    return path


def run(cfg: DictConfig) -> dict[str, float]:
    """Fit (resuming if asked), then test the best checkpoint. Returns final metrics."""
    enlarge_onednn_cache()
    run_cfg = read_run_config(OmegaConf.to_container(cfg, resolve=True))
    L.seed_everything(run_cfg.seed, workers=True)
    torch.set_float32_matmul_precision("high")
    trainer, module, datamodule, resolved = build(cfg)
    if trainer.is_global_zero:
        path = write_resolved(resolved, Path(run_cfg.exp_dir))
        log.info("resolved: %s (%s)", resolved, path)
    ckpt_dir = Path(run_cfg.exp_dir) / CHECKPOINT_DIR
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_path(run_cfg.resume, ckpt_dir))
    except Exception as err:
        if trainer.world_size > 1 and is_peer_failure(err):
            raise RuntimeError(
                f"rank {trainer.global_rank} of {trainer.world_size} lost contact with the other "
                f"processes ({type(err).__name__}): one of them died or hung (its own log says "
                f"why; a hung one is given up after distributed.timeout="
                f"{run_cfg.distributed.timeout} s, one that never started after "
                f"distributed.startup_timeout={run_cfg.distributed.startup_timeout} s). Run the "
                "same command again to resume from "
                f"{ckpt_dir / RESUME_CHECKPOINT}."
            ) from err
        raise
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    if run_cfg.run_test and datamodule.test_cuts:
        best = ckpt_dir / BEST_CHECKPOINT
        results = trainer.test(
            module, datamodule=datamodule, ckpt_path=str(best) if best.is_file() else None
        )
        metrics.update(results[0] if results else {})
    if trainer.is_global_zero:
        summary = {k: round(v, 4) for k, v in sorted(metrics.items()) if "/" in k}
        log.info("final metrics: %s", summary)
    return metrics
