import io
from collections import Counter

import pytest
import torch

from asr.data.buckets import SamplerConfig, build_eval_sampler, build_sampler
from asr.data.corpus import load_cuts
from asr.data.rank_sync import ResumePosition, simulate_ranks

TRAIN = "train-clean-100"
SMALL = {"max_duration": 10.0, "max_cut_duration": 10.0, "num_buckets": 4}


@pytest.fixture(scope="module")
def durations(tiny_corpus) -> dict[str, float]:
    return {c.id: c.duration for c in load_cuts(tiny_corpus.cuts(TRAIN))}


@pytest.fixture
def sampler_of(tiny_corpus):
    def make(cfg, **kwargs):
        return build_sampler(load_cuts(tiny_corpus.cuts(TRAIN)), cfg, **kwargs)

    make.manifest = tiny_corpus.cuts(TRAIN)
    return make


def batch_ids(sampler) -> list[list[str]]:
    return [list(batch.ids) for batch in sampler]


def ranks_of(sampler_of, cfg, world_size: int) -> list[list[list[str]]]:
    """Every rank's batches (cut ids) of one epoch, the ranks simulated in this process."""
    samplers = [sampler_of(cfg, rank=r, world_size=world_size) for r in range(world_size)]
    steps = list(simulate_ranks(samplers, cut_lists=False))
    return [[list(step[r].ids) for step in steps] for r in range(world_size)]


def rest_of(iterator) -> list[list[str]]:
    """The batches `iterator` has left (`for b in iterator` would call iter() on the
    sampler, which restarts the epoch)."""
    batches = []
    while (batch := next(iterator, None)) is not None:
        batches.append(list(batch.ids))
    return batches


def test_every_cut_once_per_epoch(sampler_of, durations) -> None:
    sampler = sampler_of(SMALL)
    for epoch in (0, 1, 2):
        sampler.set_epoch(epoch)
        batches = batch_ids(sampler)
        assert len(batches) > 8
        assert Counter(i for b in batches for i in b) == Counter(list(durations))


def test_batches_respect_max_duration(sampler_of, durations) -> None:
    # `max_duration` is a soft limit (SamplerConfig docstring): lhotse closes a batch once
    # a cut has crossed it, so every batch minus its last cut fits, and most batches are full.
    sampler = sampler_of(SMALL)
    for epoch in (0, 1, 2):
        sampler.set_epoch(epoch)
        batches = batch_ids(sampler)
        for batch in batches:
            seconds = [durations[i] for i in batch]
            assert sum(seconds[:-1]) <= SMALL["max_duration"], f"epoch {epoch}: {seconds}"
        full = [b for b in batches if sum(durations[i] for i in b) > 0.5 * SMALL["max_duration"]]
        assert len(full) >= len(batches) // 2


@pytest.mark.parametrize("shuffle", [True, False])
def test_every_cut_once_with_large_batches(sampler_of, durations, shuffle) -> None:
    # Large batches leave no bucket full: the whole epoch is sampled from partial buckets.
    cfg = {"max_duration": 200.0, "num_buckets": 4, "min_cut_duration": 0.0}
    sampler = sampler_of({**cfg, "shuffle": shuffle})
    assert Counter(i for b in batch_ids(sampler) for i in b) == Counter(list(durations))


def test_unsynchronized_buckets_on_one_process_keep_every_cut(sampler_of, durations) -> None:
    # lhotse 1.33's unsynchronized selection can end an epoch early; one process has nothing
    # to synchronize, so build_sampler takes the synchronized path there.
    sampler = sampler_of({"max_duration": 200.0, "num_buckets": 4, "sync_buckets": False})
    assert Counter(i for b in batch_ids(sampler) for i in b) == Counter(list(durations))


def test_cut_duration_limits_filter(sampler_of, durations) -> None:
    lo, hi = sorted(durations.values())[5], sorted(durations.values())[-5]
    sampler = sampler_of({**SMALL, "min_cut_duration": lo, "max_cut_duration": hi})
    kept = {i for b in batch_ids(sampler) for i in b}
    assert kept == {i for i, d in durations.items() if lo <= d <= hi}
    assert 0 < len(kept) < len(durations)


def test_unknown_key_is_an_error_naming_it(sampler_of) -> None:
    with pytest.raises(ValueError, match=r"unknown config key data.sampler.max_durations;"):
        sampler_of({"max_durations": 10.0})
    with pytest.raises(ValueError, match="valid keys of data.sampler: .*'max_duration'"):
        SamplerConfig.from_mapping({"max_duration": 10.0, "bucket_bins": [1.0]})


def test_invalid_values_are_errors_naming_the_key(sampler_of) -> None:
    with pytest.raises(ValueError, match="max_duration must be positive"):
        sampler_of({"max_duration": 0})
    with pytest.raises(ValueError, match=r"max_cut_duration \(30.0\) exceeds max_duration"):
        sampler_of({"max_duration": 10.0})
    with pytest.raises(ValueError, match="bucket_duration_bins must be increasing"):
        sampler_of({**SMALL, "bucket_duration_bins": [4.0, 2.0]})


def test_given_bucket_bins_are_upper_edges(sampler_of, durations) -> None:
    # Three buckets (<= 2.5 s, <= 4 s, <= 6 s)
    sampler = sampler_of({**SMALL, "bucket_duration_bins": [2.5, 4, 6]})
    assert sampler.bucketing.num_buckets == 3
    assert {sampler.bucket_of(b) for b in sampler} == {0, 1, 2}
    kept = {i for b in batch_ids(sampler) for i in b}
    assert kept == {i for i, d in durations.items() if SMALL.get("min_cut_duration", 0.3) <= d <= 6}
    beyond = {i for i, d in durations.items() if d > 6}
    assert sampler.cut_filter.dropped.get("beyond the last bucket", set()) == beyond


def test_state_round_trip_mid_epoch(sampler_of) -> None:
    sampler = sampler_of(SMALL)
    sampler.set_epoch(1)
    iterator = iter(sampler)
    done = [list(next(iterator).ids) for _ in range(4)]
    buffer = io.BytesIO()  # the position as a checkpoint stores it (Lightning counts the steps)
    torch.save({"epoch": 1, "steps_done": 4, "world_size": 1}, buffer)
    remaining = rest_of(iterator)
    assert len(remaining) > 3

    fresh = sampler_of(SMALL)
    buffer.seek(0)
    fresh.resume_from(ResumePosition(**torch.load(buffer, weights_only=False)))
    assert batch_ids(fresh) == remaining
    assert fresh.epoch == 1
    assert done + remaining == batch_ids(_epoch(sampler_of, 1))


def _epoch(sampler_of, epoch: int, cfg=SMALL):
    sampler = sampler_of(cfg)
    sampler.set_epoch(epoch)
    return sampler


def test_epochs_shuffle_differently_and_repeat_exactly(sampler_of) -> None:
    first = batch_ids(_epoch(sampler_of, 0))
    assert batch_ids(_epoch(sampler_of, 0)) == first
    assert batch_ids(_epoch(sampler_of, 1)) != first
    again = _epoch(sampler_of, 1)
    again.set_epoch(0)
    assert batch_ids(again) == first
    assert batch_ids(sampler_of({**SMALL, "seed": 1})) != first


def test_no_shuffle_repeats_across_epochs(sampler_of) -> None:
    cfg = {**SMALL, "shuffle": False}
    assert batch_ids(_epoch(sampler_of, 0, cfg)) == batch_ids(_epoch(sampler_of, 3, cfg))


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_partition_the_data(sampler_of, durations, world_size) -> None:
    ranks = ranks_of(sampler_of, SMALL, world_size)
    assert len(ranks[0]) > 4  # the same number of steps on every rank (one list per step)
    ids = [[i for b in batches for i in b] for batches in ranks]
    assert Counter(i for rank_ids in ids for i in rank_ids) == Counter(list(durations))
    # each rank's slice: every bucket's cuts dealt out in turn, so its buckets fill alike
    sampler = sampler_of(SMALL)
    cuts = {c.id: c for c in load_cuts(sampler_of.manifest)}
    per_bucket = [
        Counter(sampler.bucketing.bucket_of(cuts[i]) for i in rank_ids) for rank_ids in ids
    ]
    for bucket in set().union(*per_bucket):
        counts = [rank[bucket] for rank in per_bucket]
        assert max(counts) - min(counts) <= 1, (bucket, counts)
    for batches in ranks:  # the same sizes at every step where both ranks have a batch
        assert all(len(a) == len(b) for a, b in zip(ranks[0], batches, strict=True) if a and b)


def test_ranks_split_once_whatever_the_launcher_sets(sampler_of, durations, monkeypatch) -> None:
    # torchrun and Lightning's launcher export WORLD_SIZE and RANK; lhotse's samplers read
    # them when not told otherwise, which would split each rank's stream a second time.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    ranks = ranks_of(sampler_of, SMALL, 2)
    assert Counter(i for rank in ranks for b in rank for i in b) == Counter(list(durations))


def test_evaluation_batches_split_once_whatever_the_launcher_sets(tiny_corpus, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    seen = Counter()
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        split = build_eval_sampler(
            load_cuts(tiny_corpus.cuts(TRAIN)), 10.0, rank=rank, world_size=2
        )
        seen.update(c.id for batch in split for c in batch)
    assert seen == Counter(c.id for c in load_cuts(tiny_corpus.cuts(TRAIN)))


# --- data-parallel ranks, fixed bucket batch sizes, 2D bins (audio-free synthetic cuts) ---

SYN_BINS = [11.0, 13.0, 14.5, 16.0, 18.0, 35.0]


@pytest.fixture(scope="module")
def syn_cuts():
    from asr.data.synthetic_cuts import synthetic_cuts

    return synthetic_cuts(2000, seed=5)


def _bucket(cuts, bins) -> int:
    from asr.data.bins import bin_index

    cut = max(cuts, key=lambda c: c.duration)
    tokens = cut.custom["num_tokens"] if isinstance(bins[0], (list, tuple)) else None
    return bin_index([tuple(b) if isinstance(b, list) else b for b in bins], cut.duration, tokens)


SYNC_CASES = {
    "1d_max_duration": {"bucket_duration_bins": SYN_BINS, "max_duration": 300},
    "1d_fixed": {"bucket_duration_bins": SYN_BINS, "bucket_batch_size": [24, 20, 18, 16, 14, 8]},
    "2d_fixed": {
        "bucket_duration_bins": [[13.0, 40], [13.0, 60], [16.0, 55], [16.0, 70], [35.0, 140]],
        "bucket_batch_size": [20, 18, 16, 14, 8],
    },
}


@pytest.mark.parametrize("case", sorted(SYNC_CASES))
def test_two_ranks_draw_the_same_bucket_at_every_step(syn_cuts, case) -> None:
    cfg = {**SYNC_CASES[case], "max_cut_duration": 40, "buffer_size": 2000}
    bins = cfg["bucket_duration_bins"]
    for sync in (True, False):
        ranks = [
            build_sampler(syn_cuts, {**cfg, "sync_buckets": sync}, rank=r, world_size=2)
            for r in (0, 1)
        ]
        steps = list(simulate_ranks(ranks))
        assert len(steps) > 40
        full = [(a, b) for a, b in steps if len(a) and len(b)]
        same = [_bucket(a, bins) == _bucket(b, bins) for a, b in full]
        if sync:  # a bucket full on both, or near the end adjacent ones: the same sizes
            assert same.count(False) <= len(same) // 20, f"{same.count(False)} of {len(same)}"
            assert all(len(a) == len(b) for a, b in full)
        else:
            assert same.count(False) > len(same) // 4  # random pairs of buckets
        # Every cut once: together the ranks see every cut the bins hold, none twice.
        seen = Counter(c.id for step in steps for b in step for c in b)
        kept = {c.id for c in syn_cuts if _bucket([c], bins) < len(bins)}
        assert set(seen) == kept and set(seen.values()) == {1}


def test_fixed_bucket_batch_sizes(syn_cuts) -> None:
    cfg = {**SYNC_CASES["2d_fixed"], "max_cut_duration": 40}
    sampler = build_sampler(syn_cuts, cfg)
    sizes = cfg["bucket_batch_size"]
    batches = list(sampler)
    full = [len(b) == sizes[_bucket(b, cfg["bucket_duration_bins"])] for b in batches]
    # Only the last batch of each bucket may be partial.
    assert full.count(False) <= len(sizes)
    assert sum(len(b) for b in batches) + sum(sampler.cut_filter.counts().values()) == len(syn_cuts)


def test_bins_and_batch_sizes_of_different_lengths_are_an_error(syn_cuts) -> None:
    cfg = {"bucket_duration_bins": SYN_BINS, "bucket_batch_size": [8, 4]}
    with pytest.raises(
        ValueError, match="bucket_batch_size has 2 entries but bucket_duration_bins has 6"
    ):
        build_sampler(syn_cuts, cfg)
    with pytest.raises(ValueError, match="needs bucket_duration_bins"):
        build_sampler(syn_cuts, {"bucket_batch_size": [8]})


@pytest.mark.parametrize("case", ["1d_max_duration", "2d_fixed"])
def test_state_resumes_to_the_identical_next_batch(syn_cuts, case) -> None:
    cfg = {**SYNC_CASES[case], "max_cut_duration": 40}
    sampler = build_sampler(syn_cuts, cfg)
    sampler.set_epoch(3)
    iterator = iter(sampler)
    for _ in range(7):
        next(iterator)
    position = ResumePosition(epoch=3, steps_done=7, world_size=1)
    buffer = io.BytesIO()
    torch.save(position, buffer)
    expected = [list(b.ids) for b in iterator]
    fresh = build_sampler(syn_cuts, cfg)
    buffer.seek(0)
    fresh.resume_from(torch.load(buffer, weights_only=False))
    assert batch_ids(fresh) == expected and len(expected) > 10
    assert fresh.epoch == 3
    with pytest.raises(ValueError, match=r"steps of 1 data-parallel process\(es\); this run has 4"):
        build_sampler(syn_cuts, cfg, rank=0, world_size=4).resume_from(position)
