"""Four real gloo processes, each reading only its own Shar shards (written in corpus order,
one speaker after another), stay in step: the same number of steps on every rank, every cut
trained on once per epoch, the slowest rank's padded seconds within 1.10x the fastest's on
average and 1.5x at the 95th percentile; and the steps are those that `simulate_ranks`
works out in one process (what the batching benchmark measures)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from lhotse import CutSet

from asr.data.bins import equal_total_edges, token_sub_bins
from asr.data.buckets import SamplerConfig, cut_lengths
from asr.data.rank_sync import simulate_ranks
from asr.data.shar_sampler import open_shards, shard_sampler
from asr.data.synthetic_cuts import synthetic_cuts

pytestmark = pytest.mark.slow
WORLD = 4
EPOCHS = 2
SHARD_CUTS = 100


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """8,000 audio-free cuts of 80 speakers in corpus order, as Shar cut lists of 100."""
    cuts = synthetic_cuts(8000, seed=3, speakers=80)
    out = tmp_path_factory.mktemp("shar_cut_lists")
    ordered = list(cuts)
    for index, start in enumerate(range(0, len(ordered), SHARD_CUTS)):
        CutSet.from_cuts(ordered[start : start + SHARD_CUTS]).to_file(
            out / f"cuts.{index:06d}.jsonl.gz"
        )
    lengths = cut_lengths(cuts)
    bins_1d = equal_total_edges(lengths.durations, 8)
    bins_2d = [list(b) for b in token_sub_bins(lengths, bins_1d, 3)]
    return {"dir": str(out), "ids": [c.id for c in ordered], "bins": {"1d": bins_1d, "2d": bins_2d}}


def sampler_config(bins: list) -> SamplerConfig:
    """Batches of 300 padded seconds; each rank's buffer holds its 2,000 cuts."""
    return SamplerConfig.from_mapping(
        {"max_duration": 300, "max_cut_duration": 35, "min_cut_duration": 0,
         "bucket_duration_bins": bins, "buffer_size": 2000, "seed": 2}
    )  # fmt: skip


def in_step(rank: int, world: int, out_dir: Path, steps: int, source: str, bins: list) -> dict:
    """Scenario (one rank's process): its batches of `EPOCHS` epochs and the step count it
    agreed on beforehand."""
    shards = open_shards([source], [])  # cut lists alone: no audio to read
    sampler = shard_sampler(shards, [], sampler_config(bins), rank=rank, world_size=world)
    counted = sampler.count_steps(0)
    epochs = []
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        epochs.append([[(c.id, c.duration) for c in batch] for batch in sampler])
    return {"counted": counted, "epochs": epochs}


def padded(batch: list) -> float:
    return len(batch) * max(duration for _, duration in batch)


@pytest.mark.parametrize("layout", ["1d", "2d"])
def test_four_processes_reading_their_own_shards_stay_in_step(run_ranks, tmp_path, corpus, layout):
    bins = corpus["bins"][layout]
    ranks = run_ranks(tmp_path, in_step, 0, world=WORLD, source=corpus["dir"], bins=bins)
    for epoch in range(EPOCHS):
        steps = list(zip(*(r["epochs"][epoch] for r in ranks), strict=True))  # equal counts
        if epoch == 0:
            assert all(r["counted"] == len(steps) for r in ranks)
        trained = Counter(cut for step in steps for batch in step for cut, _ in batch)
        assert set(trained) == set(corpus["ids"]) and set(trained.values()) == {1}
        full = [step for step in steps if all(step)]
        assert len(full) >= 0.95 * len(steps)  # empty batches only at the epoch's end
        ratios = [max(map(padded, step)) / min(map(padded, step)) for step in full]
        assert np.mean(ratios) <= 1.10 and np.percentile(ratios, 95) <= 1.5, ratios
        assert all(len({len(batch) for batch in step}) == 1 for step in full)
        # the simulation in one process makes the same decisions as the processes
        shards = open_shards([corpus["dir"]], [])
        samplers = [
            shard_sampler(shards, [], sampler_config(bins), rank=r, world_size=WORLD)
            for r in range(WORLD)
        ]
        simulated = simulate_ranks(samplers, epoch)
        assert [[[c.id for c in b] for b in step] for step in simulated] == [
            [[cut for cut, _ in batch] for batch in step] for step in steps
        ]
