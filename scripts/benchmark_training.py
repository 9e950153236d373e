"""Steady-state training speed of a preset on fixed batches; prints one JSON line.

    python scripts/benchmark_training.py [--batches 24] [--warmup 4] [--threads 2]
    python scripts/benchmark_training.py --profile 5          # + the top ops, JSON lines
    python scripts/benchmark_training.py trainer.precision=bf16-mixed   # any Hydra override

Builds the model, objective and optimizer of `experiment=<--experiment>` as `asr-train`
does, takes the first `--batches` batches of epoch 0 of the preset's training loader (the
same batches every run: the sampler is seeded), and runs forward, backward, gradient
clipping (`trainer.gradient_clip_val`) and the optimizer step on each, on the CPU, with the
full loss (the step after the preset's CTC-only warm-up). The first `--warmup` steps are not
timed. Speed: seconds of audio trained on per wall-clock second over the timed steps.
`trainer.precision=bf16-mixed` runs forward and loss under bf16 autocast, as Lightning does.
With `--profile N`, N more steps run under `torch.profiler` and the ops with the most self
CPU time are printed, with the count of calls of ops that do work (views and metadata
excluded: they launch no kernel on a GPU).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from omegaconf import OmegaConf

from asr.data.datamodule import AsrDataModule
from asr.frames import FRAMES_PER_SECOND
from asr.profiling import launching_ops
from asr.training.oomptimizer import compose_config
from asr.training.precision import enlarge_onednn_cache, resolve_precision
from asr.training.probes import ModelSetup, build_training


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiment", default="demo", help="asr/configs/experiment/<name>.yaml")
    parser.add_argument("--data-dir", default="data/demo", help="the corpus of the preset")
    parser.add_argument("--batches", type=int, default=24, help="timed steps + warm-up steps")
    parser.add_argument("--warmup", type=int, default=4, help="first steps not timed")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--profile", type=int, default=0, help="steps to profile afterwards")
    parser.add_argument("--top", type=int, default=15, help="ops to print with --profile")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. model.loss.kind=x")
    args = parser.parse_args(argv)
    if args.batches <= args.warmup:
        parser.error(f"--batches ({args.batches}) must exceed --warmup ({args.warmup})")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    enlarge_onednn_cache()  # as asr-train does
    torch.set_num_threads(args.threads)
    overrides = [f"experiment={args.experiment}", f"data_dir={args.data_dir}", *args.overrides]
    cfg = compose_config(overrides)
    manifest = Path(cfg.data.train_cuts[0])
    if not manifest.is_file():
        sys.exit(f"{manifest} does not exist: build the corpus first (recipes/demo/run.sh)")
    torch.manual_seed(cfg.seed)
    setup = ModelSetup.from_config(cfg, ddp_grad_copy=False)
    model, objective, optimizer, step = build_training(setup, "cpu")
    datamodule = AsrDataModule(**OmegaConf.to_container(cfg.data, resolve=True))
    batches = []
    for batch in datamodule.train_dataloader():
        batches.append(batch)
        if len(batches) == args.batches + args.profile:
            break
    if len(batches) < args.batches + args.profile:
        sys.exit(f"the training loader gave only {len(batches)} batches")
    precision = resolve_precision(cfg.trainer.precision, "cpu")
    autocast = precision.startswith("bf16")
    clip = cfg.trainer.gradient_clip_val

    def train_step(batch) -> None:  # noqa: ANN001
        optimizer.zero_grad(set_to_none=True)
        context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else nullcontext()
        with context:
            loss = objective(model, batch, step=step)["loss"]
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()

    seconds, audio = [], []
    for i, batch in enumerate(batches[: args.batches]):
        start = time.perf_counter()
        train_step(batch)
        if i >= args.warmup:
            seconds.append(time.perf_counter() - start)
            audio.append(batch.feature_lens.sum().item() / FRAMES_PER_SECOND)
    result = {
        "experiment": args.experiment,
        "overrides": args.overrides,
        "precision": precision,
        "threads": args.threads,
        "steps_timed": len(seconds),
        "audio_seconds_per_second": round(sum(audio) / sum(seconds), 2),
        "step_seconds_median": round(statistics.median(seconds), 4),
        "audio_seconds_per_step": round(sum(audio) / len(audio), 2),
        "torch": torch.__version__,
    }
    if args.profile:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for batch in batches[args.batches :]:
                train_step(batch)
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        result["profiled_steps"] = args.profile
        result["launching_ops_per_step"] = round(launching_ops(events) / args.profile)
        top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[: args.top]
        for e in top:
            row = {
                "op": e.key,
                "calls_per_step": round(e.count / args.profile),
                "self_cpu_share": round(e.self_cpu_time_total / total, 4),
            }
            print(json.dumps(row))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
