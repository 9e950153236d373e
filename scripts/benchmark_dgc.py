"""Deep Gradient Compression against dense DDP on the demo; prints one JSON line per run and
a summary line.

    python scripts/benchmark_dgc.py [--data-dir data/demo]
        [--runs dense_adamw,dgc_adamw_refresh_996] [--out exp/benchmark_dgc] [--epochs 8]
        [--warmup-steps 75] [--tag T]
        [--override distributed.compression.selection=tensor ...] [--resume]

Each run trains the demo preset (`experiment=demo`) to the end with 2 processes over gloo,
one thread each (`trainer=cpu_ddp`), 15 s of audio per rank and step (the global batch of
the one-process demo), then tests the best checkpoint on test-clean. Runs:

- `dense_adamw`: DDP's all-reduce, the demo's AdamW and schedule;
- `dgc_adamw_frozen`: the same with `distributed/compression=dgc` at the paper's 99.9 %
  final sparsity with 1-D parameters whole (`PAPER`): dense AdamW for
  `variance_freeze_step` steps, then its second moment frozen and the sparse exchange with
  the paper's four warm-up stages of `--warmup-steps` steps each after them;
  `dgc_adamw_refresh`: the same with the second moment refreshed every 250 sparse steps
  from the ranks' local estimates and every parameter sparse; `dgc_adamw_refresh_vectors`:
  the same with 1-D parameters whole (84x); `dgc_adamw_refresh_996`: 99.6 %, refreshed
  every 500 steps, every parameter sparse (111x): the defaults of
  `distributed/compression=dgc` since 2026-11-26; `dgc_reduce_scatter_996`: the same with
  `exchange: reduce_scatter`. Every run names the DGC keys it depends
  on, so a change of defaults does not change what it measures. (The runs of the AdamW
  modes `direction` and `gradient`, removed since, are in recipes/demo/RESULTS.md.)
- `dense_sgd`, `dgc_sgd`: the same pair with `optim=sgd_cosine optim.lr=0.05` (momentum
  SGD, the demo's schedule; with DGC the hook applies the momentum: momentum correction and
  factor masking).

Per run: the test WER, the training wall time, and from `metrics.csv` the bytes each rank
sent per step and the compression ratio (dense bytes / sent bytes), as means over the steps
after the warm-up and over the whole run. A dense run sends every gradient byte (ratio 1).
Runs go one at a time: on a 2-core machine they would contend. The demo corpus is built
(recipes/demo/run.sh, stages corpus to features) if `--data-dir` lacks it.

`--resume` continues runs that were stopped (from their `last.ckpt`, with DGC's per-rank
state) instead of starting them afresh: long runs can be split over several sittings. The
wall time is then the sum of the sittings' (`sittings.jsonl`; a stopped sitting counts up to
its last checkpoint, the work after it being done again), and the steps logged twice (those
after `last.ckpt` before the stop) count once.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from asr.benchmarks.demo_runs import (
    ROOT,
    add_variant_arguments,
    demo_command,
    ensure_corpus,
    run_asr_train,
)
from asr.plot import read_metrics

PAPER = [  # the paper's final sparsity, 1-D parameters whole (the defaults until 2026-11-26)
    "distributed/compression=dgc",
    "distributed.compression.sparsity=0.999",
    "distributed.compression.dense_vectors=true",
]
RUNS = {  # name: extra asr-train overrides (every DGC key a run depends on named)
    "dense_adamw": [],
    "dgc_adamw_frozen": [  # dense AdamW for 500 steps, then its second moment frozen
        *PAPER,
        "distributed.compression.variance_refresh_steps=0",
    ],
    "dgc_adamw_refresh": [  # the same, the second moment refreshed every 250 sparse steps
        "distributed/compression=dgc",
        "distributed.compression.variance_refresh_steps=250",
        "distributed.compression.sparsity=0.999",
        "distributed.compression.dense_vectors=false",  # the refreshes' bytes: 500x -> 250x
    ],
    "dgc_adamw_refresh_vectors": [  # the same with 1-D parameters whole: 84x
        *PAPER,
        "distributed.compression.variance_refresh_steps=250",
    ],
    "dgc_adamw_refresh_996": [  # 99.6 %, refreshed every 500 steps: 111x (the defaults)
        "distributed/compression=dgc",
        "distributed.compression.variance_refresh_steps=500",
        "distributed.compression.sparsity=0.996",
        "distributed.compression.dense_vectors=false",
    ],
    "dgc_reduce_scatter_996": [  # the same with the exchange whose bytes stay flat in W
        "distributed/compression=dgc",
        "distributed.compression.variance_refresh_steps=500",
        "distributed.compression.sparsity=0.996",
        "distributed.compression.dense_vectors=false",
        "distributed.compression.exchange=reduce_scatter",
    ],
    "dense_sgd": ["optim=sgd_cosine", "optim.lr=0.05"],
    "dgc_sgd": ["optim=sgd_cosine", "optim.lr=0.05", *PAPER],
}


def train(name: str, args: argparse.Namespace, exp_dir: Path) -> float:
    """Train one run to the end and test it; its wall time in seconds."""
    command = [
        *demo_command(args.data_dir, exp_dir, resume=args.resume),
        "trainer=cpu_ddp",
        f"trainer.max_epochs={args.epochs}",
        "trainer.log_every_n_steps=1",
        "data.sampler.max_duration=15",
        "data.sampler.max_cut_duration=15",
        f"distributed.compression.warmup_steps={args.warmup_steps}"
        if "distributed/compression=dgc" in RUNS[name]
        else None,
        *RUNS[name],
        *args.override,
    ]
    record = exp_dir / "sittings.jsonl"
    sittings = (
        [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    )
    last_ckpt = exp_dir / "checkpoints" / "last.ckpt"
    for sitting in sittings:  # a stopped sitting counts up to its last checkpoint
        if "wall" not in sitting and last_ckpt.is_file():
            sitting["wall"] = max(0.0, last_ckpt.stat().st_mtime - sitting["start"])
            sitting["stopped"] = True
    start = time.time()
    exp_dir.mkdir(parents=True, exist_ok=True)
    record.write_text("".join(json.dumps(s) + "\n" for s in [*sittings, {"start": start}]))
    wall = run_asr_train(name, [c for c in command if c], exp_dir, threads=1)
    sittings.append({"start": start, "wall": round(wall, 1)})
    record.write_text("".join(json.dumps(s) + "\n" for s in sittings))
    return sum(s.get("wall", 0.0) for s in sittings)


def final_sparsity_from(sparsity: list[tuple[int, float]]) -> int:
    """The first step from which every logged sparsity is the last one (the end of the
    warm-up, wherever the configuration put it); 0 for a run without DGC."""
    if not sparsity:
        return 0
    final, start = sparsity[-1][1], sparsity[-1][0]
    for step, value in reversed(sparsity):
        if abs(value - final) > 1e-9:
            break
        start = step
    return start


def figures(exp_dir: Path) -> dict[str, float | int | None]:
    """Traffic and WERs from the run's metrics.csv (every version; a step logged again by a
    resumed run counts once); "after warm-up": the steps at the final sparsity."""
    series = read_metrics(exp_dir)
    after_step = final_sparsity_from(series.get("comm/sparsity", []))
    steps = series.get("train/grad_norm", [])
    dense_of = dict(series.get("comm/dense_bytes", []))
    traffic = [(step, sent, dense_of[step]) for step, sent in series.get("comm/sent_bytes", [])]
    sent = [s for _, s, _ in traffic]
    dense = [d for _, _, d in traffic]
    late = [(s, d) for step, s, d in traffic if step >= after_step]
    test = [v for _, v in series.get("test/wer", [])]
    dev = [v for _, v in series.get("val/wer", [])]
    out: dict[str, float | int | None] = {
        "optimizer_steps": len(steps),
        "test_wer": round(test[-1], 2) if test else None,
        "dev_wer_last_epoch": round(dev[-1], 2) if dev else None,
    }
    if sent:
        out["sent_bytes_per_step_mean"] = round(statistics.mean(sent))
        out["dense_bytes_per_step"] = round(statistics.mean(dense))
        out["compression_whole_run"] = round(sum(dense) / sum(sent), 1)
    if late:
        out["final_sparsity_from_step"] = after_step
        out["sent_bytes_per_step_after_warmup"] = round(statistics.mean(s for s, _ in late))
        out["compression_after_warmup"] = round(
            sum(d for _, d in late) / sum(s for s, _ in late), 1
        )
    return out


def _previous_results(out: Path) -> dict[str, dict]:
    """Results of runs measured earlier into `out` (each run writes its result.json), so a
    DGC run can be compared with a dense run of an earlier invocation."""
    found = {}
    for path in out.glob("*/result.json"):
        result = json.loads(path.read_text())
        found[result["run"]] = result
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data" / "demo")
    parser.add_argument("--train-hours", type=float, default=2.0, help="if the corpus is built")
    parser.add_argument(
        "--runs", default="dense_adamw,dgc_adamw_refresh_996", help="comma-separated"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "exp" / "benchmark_dgc")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--warmup-steps", type=int, default=75, help="per DGC warm-up stage")
    add_variant_arguments(parser, "distributed.compression.selection=tensor")
    parser.add_argument(
        "--resume", action="store_true", help="continue stopped runs from their last.ckpt"
    )
    args = parser.parse_args()
    args.data_dir = args.data_dir.resolve()
    ensure_corpus(args.data_dir, args.train_hours)
    results: dict[str, dict] = {}
    previous = _previous_results(args.out)
    for name in args.runs.split(","):
        if name not in RUNS:
            sys.exit(f"unknown run {name!r}; valid: {', '.join(RUNS)}")
        exp_dir = args.out / f"{name}{args.tag}"
        if exp_dir.exists() and not args.resume:  # an earlier measurement: start clean
            shutil.rmtree(exp_dir)
        wall = train(name, args, exp_dir)
        results[name] = {
            "run": f"{name}{args.tag}",
            "dgc_warmup_steps_per_stage": args.warmup_steps if name.startswith("dgc") else None,
            "overrides": args.override,
            "processes": 2,
            "epochs": args.epochs,
            **figures(exp_dir),
            "wall_seconds": round(wall, 1),
        }
        print(json.dumps(results[name]), flush=True)
        (exp_dir / "result.json").write_text(json.dumps(results[name]) + "\n")
    summary: dict[str, object] = {"summary": True}
    for name, dgc in results.items():
        dense = results.get("dense_" + name.split("_")[1]) or previous.get(
            "dense_" + name.split("_")[1]
        )
        if not name.startswith("dgc") or not dense:
            continue
        if dense["test_wer"] is not None and dgc["test_wer"] is not None:
            summary[f"{name}_wer_minus_dense"] = round(dgc["test_wer"] - dense["test_wer"], 2)
        summary[f"{name}_wall_over_dense"] = round(dgc["wall_seconds"] / dense["wall_seconds"], 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
