"""How long the ranks of synchronous data-parallel training wait for each other, training
from cut manifests and from Shar shards; prints one JSON line per source.

    python scripts/benchmark_rank_wait.py [--processes 4] [--sources manifests,shar]

Run from the repository root (the demo manifests name their feature files relative to it).
For each source, trains the demo preset (`experiment=demo`) for one epoch with `asr-train`
on `--processes` CPU processes over gloo (`trainer=cpu_ddp`, one thread each), without
validation or test, recording every rank's steps (`debug.step_times_dir`: each step's
seconds and the seconds the rank waited in the gradient all-reduce, from launching its last
bucket to the last all-reduce's completion: waiting for the slowest rank's gradients).
`shar` trains from the demo's training manifest written once as Shar shards of
`--shard-cuts` cuts with their stored features (`asr-export-shar --fields features`), in
corpus order, as a corpus is usually written; each rank then reads whole shards.

Per source: the wall seconds of the `asr-train` process, the steps each rank recorded and,
over the steps after the first `--warmup`, each rank's mean share of a step spent waiting
(wait / step seconds), their mean over the ranks (`wait_share`) and the mean step seconds.
The demo corpus is built (recipes/demo/run.sh, stages corpus to features) if `--data-dir`
lacks it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from asr.benchmarks.demo_runs import BIN, ROOT, demo_command, ensure_corpus, run_asr_train
from asr.benchmarks.rank_wait import rank_waits

SOURCES = ("manifests", "shar")
TRAIN_MANIFEST = "librispeech_cuts_train-clean-100-librosa_povey-feats.jsonl.gz"  # the demo's


def export_shards(data_dir: Path, out: Path, shard_cuts: int) -> Path:
    """The demo's training cuts with their features as Shar shards in `out`, in order."""
    manifest = data_dir / "manifests" / TRAIN_MANIFEST
    command = [str(BIN / "asr-export-shar"), str(manifest), "-o", str(out)]
    command += ["--shard-size", str(shard_cuts), "--fields", "features"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return out


def train_one_epoch(args: argparse.Namespace, exp_dir: Path, shards: Path | None) -> float:
    """One epoch of the demo on `args.processes` processes (from `shards` if given); its wall
    seconds. The step times go to `exp_dir/times`."""
    command = [
        *demo_command(args.data_dir, exp_dir),
        "trainer=cpu_ddp",
        f"trainer.devices={args.processes}",
        "trainer.max_epochs=1",
        "trainer.check_val_every_n_epoch=1000",  # no validation
        "run_test=false",
        f"debug.step_times_dir={exp_dir / 'times'}",
    ]
    if shards is not None:
        command += ["data.train_cuts=[]", f"data.train_shar=[{shards}]"]
    return run_asr_train(exp_dir.name, command, exp_dir)


def measure(args: argparse.Namespace, work: Path, source: str) -> dict:
    """Train from `source` and summarize its ranks' waits."""
    shards = None
    if source == "shar":
        shards = export_shards(args.data_dir, work / "shar", args.shard_cuts)
    exp_dir = work / source
    wall = train_one_epoch(args, exp_dir, shards)
    return {
        "source": source,
        "processes": args.processes,
        "shard_cuts": args.shard_cuts if source == "shar" else None,
        "wall_seconds": round(wall, 1),
        "warmup_steps_left_out": args.warmup,
        **rank_waits(exp_dir / "times", args.processes, args.warmup),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data" / "demo")
    parser.add_argument("--train-hours", type=float, default=2.0, help="if the corpus is built")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--sources", default=",".join(SOURCES), help="comma-separated")
    parser.add_argument("--shard-cuts", type=int, default=100, help="cuts per Shar shard")
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out")
    parser.add_argument(
        "--work-dir", type=Path, help="keep the shards and runs here (default: a temporary one)"
    )
    args = parser.parse_args()
    sources = args.sources.split(",")
    if unknown := set(sources) - set(SOURCES):
        parser.error(f"unknown sources {sorted(unknown)}: choose from {', '.join(SOURCES)}")
    if args.work_dir is not None and args.work_dir.exists() and any(args.work_dir.iterdir()):
        parser.error(f"--work-dir {args.work_dir} is not empty (the step times are appended)")
    args.data_dir = args.data_dir.resolve()
    ensure_corpus(args.data_dir, args.train_hours)
    with tempfile.TemporaryDirectory() as tmp:
        work = (args.work_dir or Path(tmp)).resolve()
        for source in sources:
            print(json.dumps(measure(args, work, source)), flush=True)


if __name__ == "__main__":
    main()
