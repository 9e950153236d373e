"""The comparison `recipes/demo/ssl.sh` ends with: few-label fine-tuning from scratch and
from each pre-trained encoder, one JSON table.

    python -m asr.benchmarks.ssl_compare exp/demo_ssl --runs scratch_lr0.0015 best_rq ... \\
        --steps 1000 --seed 42 --ctc-steps 28 -o exp/demo_ssl/compare.json

Read from the recipe's folders: the subset's summary (`subset/summary.json`); for each
fine-tuning run `finetune_<run>/`, its best dev WER (the lowest `val/wer` in its CSV
metrics: the checkpoint `best.ckpt` holds), its test WER (`decode-test-clean/wer.json` of
that checkpoint) and its training throughput; for each pre-training `pretrain_<objective>/`,
its wall seconds, throughput, lowest dev loss and the share of codes used over the run.

Throughput is audio seconds per second of training steps (`debug.step_times_dir`): the
audio of each optimizer step over the time since the previous one, with the gaps longer
than 3x the median (validations, epoch ends) left out. The from-scratch baseline is the
scratch run with the lowest best dev WER; each pre-trained run's `relative_cut` is
1 - its test WER / the baseline's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from asr.training.metrics_csv import metric_rows

SCRATCH = "scratch_lr"
GAP_FACTOR = 3.0  # a step interval this many times the median is not training time


def values(rows: list[dict[str, str]], name: str) -> list[float]:
    """Every logged value of `name`, in order."""
    return [float(row[name]) for row in rows if row.get(name)]


def throughput(step_times_dir: Path) -> dict[str, float] | None:
    """Audio seconds per second of rank 0's training steps (gaps over `GAP_FACTOR` x the
    median interval left out), and the steps it covers; None when nothing was recorded."""
    path = step_times_dir / "rank0.jsonl"
    if not path.is_file():
        return None
    steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    pairs = [
        (b["time"] - a["time"], b["audio_seconds"]) for a, b in zip(steps, steps[1:], strict=False)
    ]
    if not pairs:
        return None
    limit = GAP_FACTOR * statistics.median(seconds for seconds, _ in pairs)
    kept = [(seconds, audio) for seconds, audio in pairs if seconds <= limit]
    seconds = sum(s for s, _ in kept)
    return {
        "audio_seconds_per_second": round(sum(a for _, a in kept) / seconds, 2),
        "seconds_per_step": round(seconds / len(kept), 4),
        "steps": len(steps),
    }


def finetune_record(exp: Path, name: str) -> dict[str, Any]:
    """What one fine-tuning run gave: its start, learning rate, dev and test WER."""
    run_dir = exp / f"finetune_{name}"
    rows = metric_rows(run_dir)
    dev = values(rows, "val/wer")
    wer_file = run_dir / "decode-test-clean" / "wer.json"
    test = json.loads(wer_file.read_text()) if wer_file.is_file() else None
    return {
        "run": name,
        "init": "scratch" if name.startswith(SCRATCH) else name.split("-seed")[0],
        "best_dev_wer": round(min(dev), 3) if dev else None,
        "test_wer": test["wer"] if test else None,
        "optimizer_steps": int(max(values(rows, "step"), default=-1)) + 1,
        "training": throughput(run_dir / "step_times"),
    }


def pretrain_record(exp: Path, objective: str) -> dict[str, Any]:
    """What one pre-training run gave: wall time, throughput, dev loss, code use."""
    run_dir = exp / f"pretrain_{objective}"
    rows = metric_rows(run_dir)
    wall = run_dir / "wall_seconds"
    use = values(rows, "train/code_use")
    window = values(rows, "train/code_use_window")
    return {
        "objective": objective,
        "wall_seconds": float(wall.read_text()) if wall.is_file() else None,
        "training": throughput(run_dir / "step_times"),
        "best_dev_loss": round(min(values(rows, "val/loss")), 4) if rows else None,
        "code_use": {
            "first": use[0] if use else None,
            "last": use[-1] if use else None,
            "mean": round(statistics.fmean(use), 4) if use else None,
            "window_last": window[-1] if window else None,
        },
    }


def compare(exp: Path, runs: list[str], protocol: dict[str, Any]) -> dict[str, Any]:
    """The whole table: protocol, subset, pre-trainings, fine-tunings, the baseline and each
    pre-trained run's relative WER cut."""
    finetunes = [finetune_record(exp, name) for name in runs]
    scratch = [r for r in finetunes if r["init"] == "scratch" and r["best_dev_wer"] is not None]
    baseline = min(scratch, key=lambda r: r["best_dev_wer"]) if scratch else None
    for record in finetunes:
        if record["init"] != "scratch" and baseline and record["test_wer"] is not None:
            cut = 1.0 - record["test_wer"] / baseline["test_wer"] if baseline["test_wer"] else None
            record["relative_cut"] = None if cut is None else round(cut, 4)
    summary = exp / "subset" / "summary.json"
    return {
        "protocol": protocol,
        "subset": json.loads(summary.read_text()) if summary.is_file() else None,
        "pretraining": [
            pretrain_record(exp, r["init"]) for r in finetunes if r["init"] != "scratch"
        ],
        "finetuning": finetunes,
        "baseline": baseline["run"] if baseline else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ssl_compare", description=__doc__.split("\n")[0])
    parser.add_argument("exp", type=Path, help="the recipe's exp folder (exp/demo_ssl)")
    parser.add_argument("--runs", nargs="+", required=True, help="fine-tuning run names")
    parser.add_argument("--subset", required=True, help="the labelled subset's manifest")
    parser.add_argument("--steps", type=int, required=True, help="fine-tuning steps")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--ctc-steps", type=int, required=True, help="CTC-only warm-up steps")
    parser.add_argument("-o", "--output", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    protocol = {
        "subset": args.subset, "steps": args.steps, "seed": args.seed,
        "ctc_only_steps": args.ctc_steps, "warmup_steps": args.steps // 10,
        "checkpoint": "best.ckpt (lowest dev WER)",
    }  # fmt: skip
    table = compare(args.exp, args.runs, protocol)
    text = json.dumps(table, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
