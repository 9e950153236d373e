"""Test WER of decentralized training against synchronous DDP on the demo, at the same number
of samples; prints one JSON line per run and a summary line.

    python scripts/benchmark_adpsgd_wer.py [--runs ddp,adpsgd,hier] [--epochs 8]
        [--out exp/benchmark_adpsgd_wer] [--tag T] [--override optim=sgd_cosine ...]

Each run trains the demo preset (`experiment=demo`) to the end and tests the best
checkpoint on test-clean, with the same global batch of 30 s of audio per step:

- `ddp`: 2 processes (`trainer=cpu_ddp`), 15 s per rank, gradient all-reduce;
- `adpsgd`: 2 processes, 15 s per rank, `trainer.strategy=adpsgd` (fixed ring);
- `hier`: H-ADPSGD, 4 processes as 2 nodes x 2, 7.5 s per rank.

`--override` adds asr-train overrides to every run (for example the momentum-SGD pair:
`--override optim=sgd_cosine --override optim.lr=0.05 --tag _sgd`); a run is compared with
the `ddp` run of the same tag. One torch thread per process; the replicas' spread
(`gossip/spread`) is measured every `--spread-every` steps. Figures from the run's
metrics.csv: test WER, dev WER per epoch, the spread over time, wall time. Run from the
checkout (the demo's feature manifests hold relative paths); runs go one at a time.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
from pathlib import Path

from asr.benchmarks.demo_runs import (
    ROOT,
    add_variant_arguments,
    demo_command,
    ensure_corpus,
    run_asr_train,
)

RUNS = {  # name: (processes, audio seconds per rank and step, extra overrides)
    "ddp": (2, 15.0, []),
    "adpsgd": (2, 15.0, ["trainer.strategy=adpsgd"]),
    "hier": (4, 7.5, ["trainer.strategy=adpsgd", "distributed.gossip.node_size=2"]),
}


def train(name: str, args: argparse.Namespace, exp_dir: Path) -> float:
    """Train one run to the end and test it; its wall time in seconds."""
    processes, seconds, extra = RUNS[name]
    command = [
        *demo_command(args.data_dir, exp_dir),
        "trainer=cpu_ddp",
        f"trainer.devices={processes}",
        f"trainer.max_epochs={args.epochs}",
        "trainer.log_every_n_steps=10",
        f"data.sampler.max_duration={seconds}",
        f"data.sampler.max_cut_duration={min(seconds, 15.0)}",
        f"distributed.gossip.spread_every_n_steps={args.spread_every}",
        *extra,
        *args.override,
    ]
    return run_asr_train(name, command, exp_dir, threads=1)


def figures(exp_dir: Path, spread_every: int) -> dict[str, object]:
    """Test WER, dev WER per epoch and the spread over time from the run's metrics.csv (the
    spread of the measurements every `spread_every` steps, not the ones before validation)."""
    with open(exp_dir / "csv" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    test = [float(r["test/wer"]) for r in rows if r.get("test/wer")]
    dev = [round(float(r["val/wer"]), 2) for r in rows if r.get("val/wer")]
    measured = {
        int(r["step"]) + 1: round(float(r["gossip/spread"]), 4)
        for r in rows
        if r.get("gossip/spread") and not r.get("val/wer")
    }
    spread = sorted((s, v) for s, v in measured.items() if spread_every and s % spread_every == 0)
    steps = max((int(r["step"]) for r in rows if r.get("train/loss")), default=0)
    return {
        "test_wer": round(test[-1], 2) if test else None,
        "dev_wer_per_epoch": dev,
        "optimizer_steps": steps + 1,
        "spread_by_step": spread,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data" / "demo")
    parser.add_argument("--train-hours", type=float, default=2.0, help="if the corpus is built")
    parser.add_argument("--runs", default="ddp,adpsgd", help="comma-separated: ddp,adpsgd,hier")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--spread-every", type=int, default=50)
    parser.add_argument("--out", type=Path, default=ROOT / "exp" / "benchmark_adpsgd_wer")
    add_variant_arguments(parser, "optim.lr=3e-3")
    args = parser.parse_args()
    args.data_dir = args.data_dir.resolve()
    ensure_corpus(args.data_dir, args.train_hours)
    results: dict[str, dict] = {}
    for path in args.out.glob("*/result.json"):  # runs measured earlier, for the summary
        earlier = json.loads(path.read_text())
        results[earlier["run"]] = earlier
    for name in args.runs.split(","):
        if name not in RUNS:
            sys.exit(f"unknown run {name!r}; valid: {', '.join(RUNS)}")
        run = f"{name}{args.tag}"
        exp_dir = args.out / run
        if exp_dir.exists():
            shutil.rmtree(exp_dir)
        wall = train(name, args, exp_dir)
        processes, seconds, _ = RUNS[name]
        results[run] = {
            "run": run,
            "overrides": args.override,
            "processes": processes,
            "audio_seconds_per_rank_and_step": seconds,
            "epochs": args.epochs,
            **figures(exp_dir, args.spread_every),
            "wall_seconds": round(wall, 1),
        }
        print(json.dumps(results[run]), flush=True)
        (exp_dir / "result.json").write_text(json.dumps(results[run]) + "\n")
    summary: dict[str, object] = {"summary": True}
    for run, result in results.items():
        # the run of the same tag with DDP: the run's name after its RUNS key
        name = max((n for n in RUNS if run.startswith(n)), key=len, default=run)
        ddp = results.get("ddp" + run[len(name) :], {}).get("test_wer")
        if name != "ddp" and ddp is not None and result.get("test_wer") is not None:
            summary[f"{run}_wer_minus_ddp"] = round(result["test_wer"] - ddp, 2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
