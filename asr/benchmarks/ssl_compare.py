"""The comparison `recipes/demo/ssl.sh` ends with: few-label fine-tuning from scratch and
from each pre-trained encoder, one JSON table.

    python -m asr.benchmarks.ssl_compare exp/demo_ssl \\
        --runs scratch_lr0.0015-seed42 best_rq_lr0.0015-seed42 ... \\
        --steps 1000 --seed 42 --ctc-steps 28 -o exp/demo_ssl/compare.json

A run is named `<start>_lr<learning rate>-seed<seed>`, its start `scratch` or the
pre-training objective whose encoder it began from. Read from the recipe's folders: the
subset's summary (`subset/summary.json`); for each fine-tuning run `finetune_<run>/`, its
best dev WER (the lowest `val/wer` in its CSV metrics: the checkpoint `best.ckpt` holds),
its test WER (`decode-test-clean/wer.json` of that checkpoint) and its training throughput;
for each pre-training `pretrain_<objective>/`, its wall seconds, throughput, lowest dev
loss, its curves (training loss, masked accuracy and code use over the steps, dev loss per
validation) and the share of codes used over the run; for BEST-RQ with `--dev-cuts`, the
entropy of the code ids its frozen quantizer gives the dev features: the masked-prediction
loss of an encoder that learned the codes' frequencies and nothing else, to set its dev loss
against.

Throughput is audio seconds per second of training steps (`debug.step_times_dir`): the
audio of each optimizer step over the time since the previous one, with the gaps longer
than 3x the median (validations, epoch ends) left out. Each start's learning rate is
chosen by dev WER: its run with the lowest best dev WER is `chosen`; the from-scratch one is
the baseline, and each pre-trained start's chosen run has `relative_cut` = 1 - its test
WER / the baseline's (test WERs are never used to choose).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from asr.training.metrics_csv import metric_rows

SCRATCH = "scratch"
CURVE_POINTS = 10  # the pre-training curves: means over this many equal spans of the steps
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
    start, _, rest = name.rpartition("_lr")
    return {
        "run": name,
        "init": start,
        "lr": float(rest.split("-seed")[0]),
        "best_dev_wer": round(min(dev), 3) if dev else None,
        "test_wer": test["wer"] if test else None,
        "optimizer_steps": int(max(values(rows, "step"), default=-1)) + 1,
        "training": throughput(run_dir / "step_times"),
    }


def curve(rows: list[dict[str, str]], names: list[str]) -> list[dict[str, float]]:
    """The logged training values of `names`, as means over `CURVE_POINTS` equal spans of
    the logged steps, each with the span's last step."""
    logged = [row for row in rows if row.get(names[0]) and row.get("step")]
    points = []
    for i in range(min(CURVE_POINTS, len(logged))):
        span = logged[i * len(logged) // CURVE_POINTS : (i + 1) * len(logged) // CURVE_POINTS]
        if not span:
            continue
        point = {"step": int(float(span[-1]["step"]))}
        for name in names:
            seen = [float(row[name]) for row in span if row.get(name)]
            point[name] = round(statistics.fmean(seen), 4) if seen else None
        points.append(point)
    return points


def code_prior_entropy(checkpoint: Path, dev_cuts: Path) -> dict[str, Any]:
    """BEST-RQ: the entropy in nats of the code ids the checkpoint's frozen quantizer gives
    the features of `dev_cuts` (every frame, normalized as the run's features were), and
    how many distinct codes occur."""
    from lhotse import load_manifest

    from asr.data.features import normalize_features
    from asr.models.quantizers import RandomProjectionQuantizer

    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    weights = saved["state_dict"]
    config = saved["asr_bundle"]["model"]["best_rq"]
    normalize = saved["asr_bundle"]["features"]["normalize"]
    input_dim = saved["asr_bundle"]["model"]["encoder"]["input_dim"]
    factor = weights["model.quantizer.projection"].shape[1] // input_dim  # frames stacked
    quantizer = RandomProjectionQuantizer(
        input_dim, factor, code_dim=config["code_dim"],
        num_codes=config["num_codes"], num_codebooks=config["num_codebooks"],
    )  # fmt: skip
    quantizer.load_state_dict({k.removeprefix("model.quantizer."): v for k, v in weights.items()
                               if k.startswith("model.quantizer.")})  # fmt: skip
    counts: Counter[int] = Counter()
    for cut in load_manifest(dev_cuts):
        features = normalize_features(cut.load_features(), normalize)
        counts.update(quantizer(torch.from_numpy(features)[None]).flatten().tolist())
    total = sum(counts.values())
    entropy = -sum(n / total * math.log(n / total) for n in counts.values())
    return {"nats": round(entropy, 4), "codes_seen": len(counts), "frames": total}


def pretrain_record(exp: Path, objective: str, dev_cuts: Path | None = None) -> dict[str, Any]:
    """What one pre-training run gave: wall time, throughput, dev loss, curves, code use."""
    run_dir = exp / f"pretrain_{objective}"
    rows = metric_rows(run_dir)
    wall = run_dir / "wall_seconds"
    use = values(rows, "train/code_use")
    window = values(rows, "train/code_use_window")
    shown = ["train/loss", "train/mlm_accuracy", "train/code_use"]
    if any(row.get("train/contrastive_accuracy") for row in rows):
        shown.append("train/contrastive_accuracy")
    dev = [
        {"step": int(float(row["step"])), "val/loss": round(float(row["val/loss"]), 4),
         "val/mlm_accuracy": round(float(row["val/mlm_accuracy"]), 4)}
        for row in rows if row.get("val/loss") and row.get("val/mlm_accuracy")
    ]  # fmt: skip
    best = run_dir / "checkpoints" / "best.ckpt"
    prior = None
    if objective == "best_rq" and dev_cuts is not None and best.is_file():
        prior = code_prior_entropy(best, dev_cuts)
    return {
        "objective": objective,
        "wall_seconds": float(wall.read_text()) if wall.is_file() else None,
        "code_prior_entropy": prior,
        "training": throughput(run_dir / "step_times"),  # its "steps": the optimizer's
        "best_dev_loss": round(min(values(rows, "val/loss")), 4) if rows else None,
        "curves": {"training": curve(rows, shown), "dev": dev},
        "code_use": {
            "first": use[0] if use else None,
            "last": use[-1] if use else None,
            "mean": round(statistics.fmean(use), 4) if use else None,
            "window_last": window[-1] if window else None,
        },
    }


def compare(
    exp: Path, runs: list[str], protocol: dict[str, Any], dev_cuts: Path | None = None
) -> dict[str, Any]:
    """The whole table: protocol, subset, pre-trainings, fine-tunings, each start's run
    chosen by dev WER, the baseline and each pre-trained start's relative WER cut."""
    finetunes = [finetune_record(exp, name) for name in runs]
    starts = list(dict.fromkeys(r["init"] for r in finetunes))
    chosen = {}
    for start in starts:
        done = [r for r in finetunes if r["init"] == start and r["best_dev_wer"] is not None]
        if done:
            chosen[start] = min(done, key=lambda r: r["best_dev_wer"])
    baseline = chosen.get(SCRATCH)
    for start, record in chosen.items():
        record["chosen"] = True
        tested = baseline and baseline["test_wer"] and record["test_wer"] is not None
        if start != SCRATCH and tested:
            record["relative_cut"] = round(1.0 - record["test_wer"] / baseline["test_wer"], 4)
    summary = exp / "subset" / "summary.json"
    return {
        "protocol": protocol,
        "subset": json.loads(summary.read_text()) if summary.is_file() else None,
        "pretraining": [
            pretrain_record(exp, start, dev_cuts) for start in starts if start != SCRATCH
        ],
        "finetuning": finetunes,
        "baseline": baseline["run"] if baseline else None,
        "chosen": {start: record["run"] for start, record in chosen.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ssl_compare", description=__doc__.split("\n")[0])
    parser.add_argument("exp", type=Path, help="the recipe's exp folder (exp/demo_ssl)")
    parser.add_argument("--runs", nargs="+", required=True, help="fine-tuning run names")
    parser.add_argument("--subset", required=True, help="the labelled subset's manifest")
    parser.add_argument("--steps", type=int, required=True, help="fine-tuning steps")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--ctc-steps", type=int, required=True, help="CTC-only warm-up steps")
    parser.add_argument(
        "--dev-cuts", type=Path, help="dev features for BEST-RQ's code prior entropy"
    )
    parser.add_argument("-o", "--output", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    protocol = {
        "subset": args.subset, "steps": args.steps, "seed": args.seed,
        "ctc_only_steps": args.ctc_steps, "warmup_steps": args.steps // 10,
        "checkpoint": "best.ckpt (lowest dev WER)",
    }  # fmt: skip
    table = compare(args.exp, args.runs, protocol, args.dev_cuts)
    text = json.dumps(table, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
