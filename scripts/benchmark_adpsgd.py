"""Throughput of synchronous DDP against decentralized training (AD-PSGD, H-ADPSGD), with all
ranks equal and with one rank slowed down; prints one JSON line per run and a summary line.

    python scripts/benchmark_adpsgd.py [--data-dir data/demo] [--processes 4] [--steps 40]
        [--slowdown 2] [--runs ddp,fixed,random,delay,hier]

Each run trains the demo preset (`experiment=demo`, transducer loss from the first step, no
validation) for `--steps` optimizer steps on `--processes` CPU processes, one torch thread
each, `--max-duration` seconds of audio per rank and step:

- `ddp`: `trainer=cpu_ddp` (gradient all-reduce every step);
- `fixed`, `random`: `trainer.strategy=adpsgd` with the fixed or random bipartite ring;
- `delay`: the fixed ring with `delay_by_one`;
- `hier`: H-ADPSGD, nodes of 2 processes (`distributed.gossip.node_size=2`).

Every run goes twice: ranks equal, and rank 1 slowed `--slowdown` times (`debug.straggler_rank`:
it sleeps (slowdown - 1) x its own step time each step). Each rank records its steps
(`debug.step_times_dir`); a rank's pace is the audio it trained on over the time of its
steps after `--warmup` (up to the step where the first rank finished, so that a rank running
alone at the end does not count), and the throughput is the sum of the ranks' paces (under
DDP every rank's step covers all ranks' audio, so it is rank 0's pace; under H-ADPSGD a
node's, so one rank per node counts). On a machine with
fewer cores than processes the ranks share the cores, and a sleeping straggler lends its
core to the others: read the figures as what this machine shows, not as a cluster's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from asr.benchmarks.demo_runs import ROOT, demo_command, ensure_corpus, run_asr_train

RUNS = {  # name: extra asr-train overrides
    "ddp": [],
    "fixed": ["trainer.strategy=adpsgd"],
    "random": ["trainer.strategy=adpsgd", "distributed.gossip.ring=random"],
    "delay": ["trainer.strategy=adpsgd", "distributed.gossip.delay_by_one=true"],
    "hier": ["trainer.strategy=adpsgd", "distributed.gossip.node_size=2"],
}


def train(name: str, straggler: bool, args: argparse.Namespace, exp_dir: Path) -> float:
    """Run one configuration for `args.steps` steps; its wall time in seconds."""
    command = [
        *demo_command(args.data_dir, exp_dir),
        "trainer=cpu_ddp",
        f"trainer.devices={args.processes}",
        "run_test=false",
        f"trainer.max_steps={args.steps}",
        "trainer.check_val_every_n_epoch=1000",
        "model.loss.transducer_start_step=0",
        f"data.sampler.max_duration={args.max_duration}",
        f"data.sampler.max_cut_duration={args.max_duration}",
        f"debug.step_times_dir={exp_dir / 'step_times'}",
        *RUNS[name],
    ]
    if straggler:
        command += ["debug.straggler_rank=1", f"debug.straggler_slowdown={args.slowdown}"]
    return run_asr_train(name, command, exp_dir, threads=1)


def node_size(name: str) -> int:
    return 2 if name == "hier" else 1


def paces(step_dir: Path, warmup: int) -> list[float]:
    """Each rank's audio seconds per second over its steps after `warmup`, up to the moment
    the first rank finished."""
    ranks = []
    for path in sorted(step_dir.glob("rank*.jsonl"), key=lambda p: int(p.stem[4:])):
        ranks.append([json.loads(line) for line in path.read_text().splitlines()])
    first_done = min(steps[-1]["time"] for steps in ranks)
    out = []
    for steps in ranks:
        kept = [s for s in steps if s["step"] >= warmup and s["time"] <= first_done]
        if len(kept) < 2:
            out.append(0.0)
            continue
        audio = sum(s["audio_seconds"] for s in kept[1:])
        out.append(audio / (kept[-1]["time"] - kept[0]["time"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data" / "demo")
    parser.add_argument("--train-hours", type=float, default=2.0, help="if the corpus is built")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the figures")
    parser.add_argument("--max-duration", type=float, default=8.0, help="audio s per rank, step")
    parser.add_argument("--slowdown", type=float, default=2.0)
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated")
    parser.add_argument("--out", type=Path, help="keep each run's directory here")
    args = parser.parse_args()
    args.data_dir = args.data_dir.resolve()
    ensure_corpus(args.data_dir, args.train_hours)
    rate: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.out or tmp
        for name in args.runs.split(","):
            if name not in RUNS:
                sys.exit(f"unknown run {name!r}; valid: {', '.join(RUNS)}")
            for straggler in (False, True):
                tag = f"{name}_straggler" if straggler else name
                exp_dir = Path(tmp) / tag
                wall = train(name, straggler, args, exp_dir)
                per_rank = paces(exp_dir / "step_times", args.warmup)
                # a step's audio is summed over the ranks that share it: all (DDP), a node's
                # (H-ADPSGD: count each node once), or the rank's own
                total = per_rank[0] if name == "ddp" else sum(per_rank[:: node_size(name)])
                rate[tag] = total
                result = {
                    "run": tag,
                    "processes": args.processes,
                    "straggler_slowdown": args.slowdown if straggler else None,
                    "steps": args.steps,
                    "audio_seconds_per_second": round(total, 2),
                    "per_rank_audio_seconds_per_second": [round(p, 2) for p in per_rank],
                    "wall_seconds": round(wall, 1),
                }
                print(json.dumps(result), flush=True)
    summary: dict[str, object] = {"summary": True}
    for name in args.runs.split(","):
        if name in rate and f"{name}_straggler" in rate:
            drop = 1 - rate[f"{name}_straggler"] / rate[name]
            summary[f"{name}_throughput_drop_with_straggler"] = round(drop, 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
