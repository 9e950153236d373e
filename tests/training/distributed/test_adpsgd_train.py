"""`trainer.strategy=adpsgd` through `asr-train` with 2 real processes over gloo: it trains,
logs the replicas' spread, validates the consensus, and resumes from its checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

ADPSGD = ("trainer.strategy=adpsgd", "distributed.gossip.spread_every_n_steps=2")


@pytest.mark.slow
@pytest.mark.long
def test_adpsgd_trains_validates_the_consensus_and_resumes(train_two_ranks, tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    train_two_ranks(exp, *ADPSGD, "trainer.max_epochs=1")
    first = torch.load(exp / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    rows = train_two_ranks(exp, *ADPSGD, "trainer.max_epochs=2", "resume=auto")
    second = torch.load(exp / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert (first["epoch"], second["epoch"]) == (0, 1)
    assert second["global_step"] > first["global_step"] > 0
    spreads = [float(r["gossip/spread"]) for r in rows if r.get("gossip/spread")]
    assert spreads and all(s >= 0 and s == s for s in spreads)  # finite, measured
    wers = [float(r["val/wer"]) for r in rows if r.get("val/wer")]
    assert len(wers) == 2  # one validation of the consensus per epoch
    state = second["state_dict"]
    assert all(bool(torch.isfinite(t).all()) for t in state.values() if t.is_floating_point())
