"""Data-parallel training speed on one machine; prints one JSON line per configuration and a
summary line.

    python scripts/benchmark_ddp.py [--data-dir data/demo] [--steps 60]

Trains the demo preset (`experiment=demo`, transducer loss from the first step, no
validation) for `--steps` optimizer steps with `asr-train`, once per configuration:

- `1x2`: one process, two torch threads;
- `1x1`: one process, one thread (the per-process baseline);
- `2x1`: two processes (DDP over gloo), one thread each (`trainer=cpu_ddp`);
- `2x1_straggler`: the same with rank 1 slowed down `--slowdown` times
  (`debug.straggler_rank=1`: it sleeps (slowdown - 1) x its own step time every step).

Each rank draws batches of the preset's `data.sampler.max_duration` seconds, so a
two-process step trains on twice the audio of a one-process step. The speed is audio
seconds (summed over ranks) per wall-clock second, over the steps after `--warmup`, read from
the run's `metrics.csv` (`train/audio_seconds`, `train/audio_seconds_per_second`). Runs one
configuration at a time: on a 2-core machine they would contend. The demo corpus is built
(recipes/demo/run.sh, stages corpus to features) if `--data-dir` lacks it.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
from pathlib import Path

from asr.benchmarks.demo_runs import ROOT, demo_command, ensure_corpus, run_asr_train

CONFIGS = {  # name: (processes, threads per process, straggler)
    "1x2": (1, 2, False),
    "1x1": (1, 1, False),
    "2x1": (2, 1, False),
    "2x1_straggler": (2, 1, True),
}


def train(name: str, args: argparse.Namespace, exp_dir: Path) -> float:
    """Run one configuration to `args.steps` steps; its wall time in seconds."""
    processes, threads, straggler = CONFIGS[name]
    command = [
        *demo_command(args.data_dir, exp_dir),
        "run_test=false",
        f"trainer.max_steps={args.steps}",
        "trainer.log_every_n_steps=1",
        "trainer.check_val_every_n_epoch=1000",
        "model.loss.transducer_start_step=0",
    ]
    if processes > 1:
        command += ["trainer=cpu_ddp", f"trainer.devices={processes}"]
    else:
        command += ["trainer.accelerator=cpu", "trainer.devices=1"]
    if straggler:
        command += ["debug.straggler_rank=1", f"debug.straggler_slowdown={args.slowdown}"]
    return run_asr_train(name, command, exp_dir, threads=threads)


def speed(exp_dir: Path, warmup: int) -> dict[str, float]:
    """Audio seconds per second and the median step time over the steps after `warmup`."""
    with open(exp_dir / "csv" / "version_0" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/audio_seconds_per_second")]
    rows = [r for r in rows if int(r["step"]) >= warmup]
    audio = [float(r["train/audio_seconds"]) for r in rows]
    seconds = [
        a / float(r["train/audio_seconds_per_second"]) for a, r in zip(audio, rows, strict=True)
    ]
    return {
        "steps_measured": len(rows),
        "audio_seconds_per_second": round(sum(audio) / sum(seconds), 2),
        "step_seconds_median": round(statistics.median(seconds), 3),
        "audio_seconds_per_step": round(statistics.mean(audio), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data" / "demo")
    parser.add_argument("--train-hours", type=float, default=2.0, help="if the corpus is built")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the figures")
    parser.add_argument("--slowdown", type=float, default=2.0)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated")
    args = parser.parse_args()
    args.data_dir = args.data_dir.resolve()
    ensure_corpus(args.data_dir, args.train_hours)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs.split(","):
            wall = train(name, args, Path(tmp) / name)
            processes, threads, straggler = CONFIGS[name]
            results[name] = {
                "config": name,
                "processes": processes,
                "threads_per_process": threads,
                "straggler_slowdown": args.slowdown if straggler else None,
                "steps": args.steps,
                **speed(Path(tmp) / name, args.warmup),
                "wall_seconds": round(wall, 1),
            }
            print(json.dumps(results[name]), flush=True)
    rate = {name: r["audio_seconds_per_second"] for name, r in results.items()}
    summary = {"summary": True}
    if {"2x1", "1x2"} <= rate.keys():
        summary["2x1_over_1x2"] = round(rate["2x1"] / rate["1x2"], 3)
    if {"2x1", "1x1"} <= rate.keys():
        summary["2x1_scaling_efficiency"] = round(rate["2x1"] / (2 * rate["1x1"]), 3)
    if {"2x1", "2x1_straggler"} <= rate.keys():
        summary["straggler_run_slowdown"] = round(rate["2x1"] / rate["2x1_straggler"], 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
