"""Fit as `asr-train` does, in this process and (through Lightning's launcher) its peers,
recording what each rank trained on; optionally inject a NaN loss. Used by test_ddp.py.

    python ddp_worker.py --record DIR [--nan-at RANK:STEP] [--validate] OVERRIDE...

Writes DIR/rank{R}.json per rank: the weights' and the encoder's digests when training
starts, every training step (step, epoch, cut ids, skipped cut ids, bucket, a digest of the
batch's features, digests of the weights and of the encoder after it), the final digest,
the non-finite step count, and with --validate the validation metrics of the final weights. With
--validate-only CKPT it only validates that checkpoint, once per --eval-max-durations
(seconds per validation batch), and writes the metrics of each.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from lhotse import CutSet
from lhotse.shar import LazySharIterator

from asr.data.corpus import load_cuts
from asr.data.shar import shar_fields
from asr.training.command import CONFIG_DIR
from asr.training.train import build, resume_path


def weights_digest(model: torch.nn.Module) -> str:
    """A hash of the parameters (not the buffers: DDP broadcasts BatchNorm statistics from
    rank 0 at the next forward, so between steps they differ by rank)."""
    h = hashlib.sha256()
    for name, value in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class NanAt:
    """The objective, with its loss made NaN on one rank at one global step."""

    def __init__(self, objective: Any, rank: int, step: int) -> None:
        self.objective, self.rank, self.step = objective, rank, step

    def __getattr__(self, name: str) -> Any:
        return getattr(self.objective, name)

    def __call__(self, model, batch, step: int) -> dict[str, torch.Tensor]:
        out = self.objective(model, batch, step)
        if step == self.step and rank() == self.rank and torch.is_grad_enabled():
            out["loss"] = out["loss"] * float("nan")
        return out


class Recorder(L.Callback):
    def __init__(self, cuts: dict[str, Any]) -> None:
        self.cuts, self.steps, self.start = cuts, [], {}

    def on_train_start(self, trainer, module) -> None:
        self.start = {
            "global_step": trainer.global_step,
            "digest": weights_digest(module.model),
            "encoder_digest": weights_digest(module.model.encoder),
        }

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        ids = [*batch.cut_ids, *(i for v in batch.skipped.values() for i in v)]
        first = self.cuts[re.sub(r"_dup\d+$", "", ids[0])] if ids else None  # Shar: may be empty
        sampler = trainer.train_dataloader.sampler
        self.steps.append(
            {
                "step": trainer.global_step,
                "epoch": trainer.current_epoch,
                "cut_ids": batch.cut_ids,
                "skipped": batch.skipped,
                "bucket": None if first is None else sampler.bucket_of(CutSet.from_cuts([first])),
                "features": hashlib.sha256(batch.features.numpy().tobytes()).hexdigest(),
                "digest": weights_digest(module.model),
                "encoder_digest": weights_digest(module.model.encoder),
            }
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--nan-at", default=None, help="RANK:STEP")
    parser.add_argument("--validate", action="store_true", help="validate the final weights")
    parser.add_argument("--validate-only", type=Path, default=None, help="validate this .ckpt")
    parser.add_argument("--eval-max-durations", default="10", help="with --validate-only")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = hydra.compose("train", overrides=args.overrides)
    L.seed_everything(cfg.seed, workers=True)
    trainer, module, datamodule, _ = build(cfg)
    if args.nan_at:
        nan_rank, nan_step = map(int, args.nan_at.split(":"))
        module.objective = NanAt(module.objective, nan_rank, nan_step)
    cuts = {c.id: c for path in cfg.data.train_cuts for c in load_cuts(path)}
    for source in cfg.data.get("train_shar") or []:  # the shards' cut lists, no audio
        cuts |= {c.id: c for c in LazySharIterator(fields={"cuts": shar_fields(source)["cuts"]})}
    recorder = Recorder(cuts)
    trainer.callbacks.append(recorder)
    args.record.mkdir(parents=True, exist_ok=True)
    if args.validate_only:  # once per validation batch size: metrics by max duration
        metrics = {}
        for max_duration in args.eval_max_durations.split(","):
            datamodule.valid_max_duration = float(max_duration)
            trainer.validate(module, datamodule, ckpt_path=args.validate_only, verbose=False)
            metrics[max_duration] = {k: float(v) for k, v in trainer.callback_metrics.items()}
        (args.record / f"rank{trainer.global_rank}.json").write_text(json.dumps(metrics))
        return
    ckpt = resume_path(cfg.resume, Path(cfg.exp_dir) / "checkpoints")
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt)
    record = {
        "world_size": trainer.world_size,
        "global_step": trainer.global_step,
        "start": recorder.start,
        "steps": recorder.steps,
        "digest": weights_digest(module.model),
        "nonfinite_steps": module.nonfinite.total,
        "finite": all(bool(torch.isfinite(p).all()) for p in module.model.parameters()),
    }
    if args.validate:
        trainer.validate(module, datamodule=datamodule, verbose=False)
        record["validation"] = {k: float(v) for k, v in trainer.callback_metrics.items()}
    path = args.record / f"rank{trainer.global_rank}.json"
    path.write_text(json.dumps(record))


if __name__ == "__main__":
    main()
