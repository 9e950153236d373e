"""Do two commits train the same weights? Trains a preset for a few optimizer steps with
the code of each commit (a git worktree each, the same Python environment, corpus, batch
sizes and seed) and compares the checkpoints tensor by tensor. Prints JSON; exits 1 when
any tensor differs.

    python scripts/compare_weights.py --before 73b5e54 [--after HEAD] [--steps 50] \
        [--work exp/compare_weights] [-- OVERRIDE...]

The corpus is a small demo corpus (`--train-hours`, default 0.15) made by the demo recipe's
stages 0-5 under WORK/data (made once, kept). Training uses one CPU thread and no data
loader workers, so that the arithmetic is the same in both runs.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def prepare_corpus(work: Path, experiment: str, train_hours: float) -> tuple[Path, Path]:
    """The demo recipe's corpus, manifests, tokenizer, features, bins and batch sizes."""
    data, exp = work / "data", work / "prepare"
    env = {
        **os.environ,
        "DATA": str(data),
        "EXP": str(exp),
        "EXPERIMENT": experiment,
        "TRAIN_HOURS": str(train_hours),
        # bins and batch sizes searched for this corpus into one file that both commits read
        # (a preset's shipped set may differ between the two)
        "BATCH_SEARCH": "1",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    script = ROOT / "recipes/demo/run.sh"
    subprocess.run([str(script), "--stop-stage", "batch-sizes"], env=env, cwd=ROOT, check=True)
    return data, exp / "batch_sizes.yaml"


def model_kind_of(experiment: str) -> str:
    """The model kind of a preset (`transducer`, `aed`, `ssl`), from this checkout's configs."""
    import hydra

    from asr.models.build import model_kind
    from asr.training.command import CONFIG_DIR

    with hydra.initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = hydra.compose("train", overrides=[f"experiment={experiment}"])
    return model_kind(cfg.model)


def worktree(work: Path, revision: str) -> tuple[Path, str]:
    """A detached worktree of `revision` under WORK (made once) and its full commit id."""
    commit = subprocess.run(
        ["git", "rev-parse", revision], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    tree = work / f"tree-{commit[:10]}"
    if not tree.exists():
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), commit], cwd=ROOT, check=True
        )
    return tree, commit


def train(tree: Path, run_dir: Path, data: Path, batch_sizes: Path | None, args, overrides) -> dict:
    """`asr-train` of the worktree's code (its package and configs) for `args.steps` steps
    (with the searched bins and batch sizes, or the preset's sampler where None)."""
    bins = [] if batch_sizes is None else [f"data.sampler.bins_file={batch_sizes.resolve()}"]
    # asr-train's entry point: asr.training.command since a0aaa63, asr.training.train before
    entry = "command" if (tree / "asr" / "training" / "command.py").exists() else "train"
    command = [
        sys.executable,
        "-m",
        f"asr.training.{entry}",
        f"experiment={args.experiment}",
        f"data_dir={data.resolve()}",
        f"exp_dir={run_dir.resolve()}",
        *bins,
        f"trainer.max_steps={args.steps}",
        "data.num_workers=0",
        "resume=false",
        "run_test=false",
        "logger=csv",
        *overrides,
    ]
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    shutil.rmtree(run_dir, ignore_errors=True)  # no resume, no last-v1.ckpt
    start = time.monotonic()
    subprocess.run(command, env=env, cwd=tree, check=True)
    seconds = round(time.monotonic() - start, 1)
    return {"seconds": seconds, "logged_groups": logged_groups(run_dir)}


def logged_groups(run_dir: Path) -> list[str]:
    """The metric groups the run logged (`train`, `dgc`, ...): shows what ran."""
    names = set()
    for path in run_dir.glob("csv/version_*/metrics.csv"):
        with open(path) as f:
            names.update(next(csv.reader(f)))
    return sorted({name.split("/")[0] for name in names if "/" in name})


def compare(before: Path, after: Path) -> dict:
    """Tensor-by-tensor comparison of two Lightning checkpoints' state dicts."""
    a = torch.load(before, map_location="cpu", weights_only=False)
    b = torch.load(after, map_location="cpu", weights_only=False)
    sa, sb = a["state_dict"], b["state_dict"]
    shared = sorted(set(sa) & set(sb))
    differing = [k for k in shared if not torch.equal(sa[k], sb[k])]
    largest = max(
        (float((sa[k].double() - sb[k].double()).abs().max()) for k in differing), default=0.0
    )
    return {
        "global_step": [a["global_step"], b["global_step"]],
        "tensors": len(shared),
        "only_before": sorted(set(sa) - set(sb)),
        "only_after": sorted(set(sb) - set(sa)),
        "differing": differing,
        "largest_difference": largest,
        "identical": not differing and set(sa) == set(sb),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="a commit, tag or branch")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--experiment", default="demo")
    parser.add_argument("--train-hours", type=float, default=0.15)
    parser.add_argument("--work", type=Path, default=ROOT / "exp/compare_weights")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for both runs")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    # Pre-training reads audio alone: its corpus is the transducer's (the recipe makes a
    # tokenizer), and its batches are the preset's own (duration buckets, no tokens).
    pretraining = model_kind_of(args.experiment) == "ssl"
    recipe_experiment = "demo" if pretraining else args.experiment
    data, batch_sizes = prepare_corpus(args.work, recipe_experiment, args.train_hours)
    if pretraining:
        batch_sizes = None
    result: dict = {"experiment": args.experiment, "steps": args.steps, "overrides": args.overrides}
    checkpoints = []
    for side in ("before", "after"):
        tree, commit = worktree(args.work, getattr(args, side))
        tag = hashlib.sha256(" ".join(args.overrides).encode()).hexdigest()[:8]
        run_dir = args.work / f"run-{commit[:10]}-{tag}"
        result[side] = {
            "commit": commit,
            **train(tree, run_dir, data, batch_sizes, args, args.overrides),
        }
        checkpoints.append(run_dir / "checkpoints/last.ckpt")
    result.update(compare(*checkpoints))
    print(json.dumps(result))
    sys.exit(0 if result["identical"] else 1)


if __name__ == "__main__":
    main()
