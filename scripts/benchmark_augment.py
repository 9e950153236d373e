"""What on-the-fly augmentation costs: the data loader's time per training batch with each
transform alone and all together, and a training step's time with and without it. Prints
one JSON line per measurement.

    python scripts/benchmark_augment.py                    # the demo corpus, both parts
    python scripts/benchmark_augment.py --batches 40 --train-steps 0   # loading only

Loading (`"part": "loading"`): the first `--batches` training batches of epoch 0 of
`experiment=demo_augment`, built as `asr-train` builds them (the bucketing sampler, then
`AsrDataset`), read in this process one after another: stored features
(`experiment=demo`'s), features computed from the audio without augmentation, with each
transform of `data/augment=demo` alone, and with all of them. Per variant: seconds per
batch and audio seconds per second.

Training (`"part": "training"`): `asr-train` of `experiment=demo` and of
`experiment=demo_augment` for `--train-steps` optimizer steps each, one after the other, as
the presets run (stored features read in the training process; audio augmented and
featurized by one loader process beside it), every step with the full loss (no CTC-only
warm-up), timed per step by `debug.step_times_dir`: the median and the mean (waits for the
loader included) of the steps after the first five.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hydra
from omegaconf import OmegaConf

from asr.training.command import CONFIG_DIR
from asr.training.train import data_module

TRANSFORMS = ("speed", "volume", "reverb", "noise")
VARIANTS = ("stored_features", "audio", *TRANSFORMS, "all")


def compose(overrides: list[str]) -> dict:
    with hydra.initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = hydra.compose("train", overrides=overrides)
    return OmegaConf.to_container(cfg.data, resolve=True)


def variants(data_dir: str) -> dict[str, list[str]]:
    """Name -> the Hydra overrides of one loading variant."""
    base = [f"data_dir={data_dir}", "data.num_workers=0"]
    audio = [*base, "experiment=demo_augment"]
    out = {
        "stored_features": [*base, "experiment=demo"],
        "audio": [*audio, "data.augment=null"],
    }
    for kept in TRANSFORMS:
        out[kept] = [*audio, *(f"data.augment.{t}=null" for t in TRANSFORMS if t != kept)]
    out["all"] = audio
    return out


def loading(name: str, overrides: list[str], batches: int) -> dict:
    loader = data_module(compose(overrides), pretraining=False).train_dataloader()
    loader.sampler.set_epoch(0)
    seconds = audio = 0.0
    count = 0
    it = iter(loader)
    while count < batches:
        began = time.perf_counter()
        batch = next(it, None)
        if batch is None:
            break
        seconds += time.perf_counter() - began
        audio += float(batch.feature_lens.sum()) / 100  # 10 ms frames
        count += 1
    return {
        "part": "loading",
        "variant": name,
        "batches": count,
        "seconds_per_batch": round(seconds / count, 4),
        "audio_seconds_per_second": round(audio / seconds, 1),
    }


def training(experiment: str, data_dir: str, steps: int, work: Path) -> dict:
    times = work / experiment
    command = [
        str(Path(sys.executable).with_name("asr-train")),
        f"experiment={experiment}", f"data_dir={data_dir}", f"exp_dir={work / 'exp' / experiment}",
        f"trainer.max_steps={steps}", "run_test=false", "logger=csv", "trainer.accelerator=cpu",
        f"debug.step_times_dir={times}", "model.loss.transducer_start_step=0",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    lines = (times / "rank0.jsonl").read_text().splitlines()
    stamps = [json.loads(line)["time"] for line in lines]
    intervals = [b - a for a, b in zip(stamps[5:], stamps[6:], strict=False)]
    return {
        "part": "training",
        "experiment": experiment,
        "steps": len(intervals),
        "seconds_per_step": round(statistics.median(intervals), 4),
        "mean_seconds_per_step": round(statistics.fmean(intervals), 4),
        "threads": os.environ.get("OMP_NUM_THREADS", "default"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default="data/demo")
    parser.add_argument("--batches", type=int, default=30, help="loading: batches per variant")
    parser.add_argument("--train-steps", type=int, default=45, help="0: no training part")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    args = parser.parse_args()
    for name, overrides in variants(args.data_dir).items():
        if name in args.variants.split(",") and args.batches > 0:
            print(json.dumps(loading(name, overrides, args.batches)), flush=True)
    if args.train_steps > 0:
        with tempfile.TemporaryDirectory() as work:
            for experiment in ("demo", "demo_augment"):
                result = training(experiment, args.data_dir, args.train_steps, Path(work))
                print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
