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
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
CONFIGS = {  # name: (processes, threads per process, straggler)
    "1x2": (1, 2, False),
    "1x1": (1, 1, False),
    "2x1": (2, 1, False),
    "2x1_straggler": (2, 1, True),
}


def ensure_corpus(data_dir: Path, train_hours: float) -> None:
    feats = data_dir / "manifests" / "librispeech_cuts_train-clean-100-feats.jsonl.gz"
    if feats.is_file():
        return
    print(f"building the demo corpus in {data_dir} ({train_hours} h)", file=sys.stderr)
    env = {**os.environ, "DATA": str(data_dir), "TRAIN_HOURS": str(train_hours)}
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    subprocess.run(
        ["bash", str(ROOT / "recipes/demo/run.sh"), "--stop-stage", "features"],
        env=env,
        check=True,
        stdout=sys.stderr,
    )


def demo_command(data_dir: Path, exp_dir: Path, resume: bool = False) -> list[str]:
    """The start of every benchmark's `asr-train` command line: the demo preset on
    `data_dir`, a fresh run into `exp_dir` (with `resume`, continued from its last.ckpt),
    metrics to its metrics.csv."""
    return [
        str(BIN / "asr-train"),
        "experiment=demo",
        f"data_dir={data_dir}",
        f"exp_dir={exp_dir}",
        "logger=csv",
        f"resume={'auto' if resume else 'false'}",
    ]


def add_variant_arguments(parser: argparse.ArgumentParser, example: str) -> None:
    """`--tag` and the repeatable `--override` of the benchmarks that train the demo to the
    end: extra asr-train overrides for every run, and a suffix for the run names."""
    parser.add_argument("--tag", default="", help="appended to the run names (and directories)")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        help=f"an extra asr-train override for every run (repeatable), e.g. {example}",
    )


def run_asr_train(name: str, command: list[str], exp_dir: Path, threads: int = 1) -> float:
    """Run an `asr-train` command line writing to `exp_dir` (`threads` torch threads per
    process, W&B off) to its end; its wall time in seconds. All ranks' stderr goes to
    `exp_dir/asr_train.stderr`; a failure raises with that file's name and its end."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "WANDB_MODE": "disabled"}
    exp_dir.mkdir(parents=True, exist_ok=True)
    stderr_path = exp_dir / "asr_train.stderr"
    start = time.perf_counter()
    with open(stderr_path, "w") as stderr:
        done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    if done.returncode != 0:
        tail = stderr_path.read_text()[-3000:]
        raise RuntimeError(f"{name} failed (all of its stderr: {stderr_path}):\n{tail}")
    return time.perf_counter() - start


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
