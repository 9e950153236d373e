"""Running `asr-train` on the demo corpus for the training benchmarks: the corpus built if
missing, the common start of the command line, one run to its end with its wall time.

`ROOT` is the checkout the package lives in (the package is installed editable, so it is
the checkout); `BIN` is the running interpreter's bin directory, where `asr-train` is.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def ensure_corpus(data_dir: Path, train_hours: float) -> None:
    """Build the demo corpus of `train_hours` hours in `data_dir` (recipes/demo/run.sh up to
    the features stage) unless its training features are already there."""
    feats = data_dir / "manifests" / "librispeech_cuts_train-clean-100-librosa-feats.jsonl.gz"
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
