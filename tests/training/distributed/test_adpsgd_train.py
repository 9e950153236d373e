"""`trainer.strategy=adpsgd` through `asr-train` with 2 real processes over gloo: it trains,
logs the replicas' spread, validates the consensus, and resumes from its checkpoint."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def train(train_overrides, exp_dir: Path, *extra: str) -> None:
    command = [
        str(BIN / "asr-train"),
        *train_overrides(exp_dir),
        "experiment=demo",
        "trainer=cpu_ddp",
        "trainer.devices=2",
        "trainer.strategy=adpsgd",
        "model.loss.transducer_start_step=0",
        "run_test=false",
        "distributed.gossip.spread_every_n_steps=2",
        *extra,
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_adpsgd_trains_validates_the_consensus_and_resumes(train_overrides, tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    train(train_overrides, exp, "trainer.max_epochs=1")
    first = torch.load(exp / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    train(train_overrides, exp, "trainer.max_epochs=2", "resume=auto")
    second = torch.load(exp / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert (first["epoch"], second["epoch"]) == (0, 1)
    assert second["global_step"] > first["global_step"] > 0
    rows = []
    for path in sorted((exp / "csv").glob("version_*/metrics.csv")):
        with open(path) as f:
            rows += list(csv.DictReader(f))
    spreads = [float(r["gossip/spread"]) for r in rows if r.get("gossip/spread")]
    assert spreads and all(s >= 0 and s == s for s in spreads)  # finite, measured
    wers = [float(r["val/wer"]) for r in rows if r.get("val/wer")]
    assert len(wers) == 2  # one validation of the consensus per epoch
    state = second["state_dict"]
    assert all(bool(torch.isfinite(t).all()) for t in state.values() if t.is_floating_point())
