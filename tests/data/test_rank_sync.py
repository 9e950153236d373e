"""The ranks kept in step (`asr.data.rank_sync`): evaluation split, the per-step agreement
on hand-made tables, ranks of very different sizes, and the clear error without
torch.distributed."""

from collections import Counter

import numpy as np
import pytest
from lhotse import CutSet
from lhotse.dataset.sampling.base import TimeConstraint
from lhotse.testing.dummies import dummy_cut

from asr.data.rank_sync import (
    READ_MORE,
    Agreement,
    Bucketing,
    EvalSplit,
    Step,
    WholeStream,
    simulate_ranks,
)


def batches(sizes: list[int]) -> list[CutSet]:
    """CutSets of the given sizes with distinct cut ids."""
    out, start = [], 0
    for size in sizes:
        out.append(CutSet.from_cuts(dummy_cut(start + i) for i in range(size)))
        start += size
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("sizes", [[3, 2, 4, 1, 2], [5], [2, 2], []])
def test_eval_split_gives_every_cut_once_and_every_rank_as_many_batches(
    world_size: int, sizes: list[int]
) -> None:
    stream = batches(sizes)
    ranks = [list(EvalSplit(stream, rank=r, world_size=world_size)) for r in range(world_size)]
    assert len({len(r) for r in ranks}) == 1  # the same number of steps on every rank
    assert len(ranks[0]) == -(-len(sizes) // world_size)  # ceil: only the last round pads
    seen = Counter(cut.id for rank in ranks for batch in rank for cut in batch)
    assert seen == Counter(cut.id for batch in stream for cut in batch)  # no duplicates
    for r, rank in enumerate(ranks):  # rank r keeps batches r, r + W, ...
        assert [list(b.ids) for b in rank if len(b)] == [list(b.ids) for b in stream[r::world_size]]


def test_eval_split_rejects_a_rank_outside_the_world() -> None:
    with pytest.raises(ValueError, match=r"rank must lie in \[0, world_size=2\), got 2"):
        EvalSplit([], rank=2, world_size=2)


# --- the per-step agreement (asr.data.rank_sync.Agreement), on hand-made tables ---


def _bucketing(num_buckets: int, buffer_size: int = 8) -> Bucketing:
    return Bucketing(
        num_buckets=num_buckets,
        bucket_of=lambda cut: 0,
        new_batch=lambda: TimeConstraint(max_cuts=4),
        buffer_size=buffer_size,
    )


def _table(fits, full, waiting, exhausted) -> np.ndarray:
    """Rows of `RankBuffers.summary`: per rank fits, full flags, waiting cuts, exhausted."""
    return np.array(
        [[*f, *u, *w, e] for f, u, w, e in zip(fits, full, waiting, exhausted, strict=True)]
    )


def test_a_bucket_full_on_every_rank_gives_every_rank_as_many_cuts() -> None:
    agreement = Agreement(_bucketing(3), world_size=2, epoch=0)
    table = _table([[4, 2, 4], [3, 4, 4]], [[1, 0, 1], [1, 1, 1]], [[9, 2, 5], [3, 8, 6]], [0, 0])
    seen = set()
    for _ in range(20):
        step = agreement.decide(table)
        assert isinstance(step, Step)
        bucket, width, size = step.takes[0]
        assert step.takes[1] == (bucket, width, size) and width == 1
        assert bucket in (0, 2)  # bucket 1 is not full on rank 0
        assert size == {0: 3, 2: 4}[bucket]  # the fewest any rank's batch holds
        seen.add(bucket)
    assert seen == {0, 2}  # drawn at random


def test_without_a_full_bucket_the_ranks_read_further_then_merge_buckets() -> None:
    agreement = Agreement(_bucketing(2, buffer_size=8), world_size=2, epoch=0)
    table = _table([[2, 0], [0, 3]], [[0, 0], [0, 0]], [[2, 0], [0, 3]], [0, 0])
    targets = []
    while (step := agreement.decide(table)) is READ_MORE and agreement.width == 1:
        targets.append(agreement.buffer_target)
    assert targets == [9, 10, 11, 12]  # an eighth of the buffer at a time, up to a half
    assert agreement.width == 2  # then windows of adjacent buckets
    merged = _table([[4], [3]], [[1], [0]], [[4], [3]], [0, 0])
    step = agreement.decide(merged)  # not full on rank 1, and one window holds every bucket
    assert step == Step(((0, 2, 3), (0, 2, 3)))
    assert agreement.width == 1  # the next step starts from single buckets again


def test_once_a_rank_has_nothing_left_it_gets_empty_batches() -> None:
    agreement = Agreement(_bucketing(1), world_size=3, epoch=0)
    table = _table([[2], [0], [1]], [[0], [0], [0]], [[2], [0], [1]], [1, 1, 1])
    assert agreement.decide(table) == Step(((0, 1, 1), (0, 1, 0), (0, 1, 1)))
    empty = _table([[0], [0], [0]], [[0], [0], [0]], [[0], [0], [0]], [1, 1, 1])
    assert agreement.decide(empty) is None  # the epoch is over


def test_ranks_of_very_different_sizes_take_as_many_steps_and_every_cut_once() -> None:
    from asr.data.buckets import build_sampler
    from asr.data.synthetic_cuts import synthetic_cuts

    cuts = list(synthetic_cuts(400, seed=1))
    parts = [cuts[:300], cuts[300:380], cuts[380:]]  # 300, 80 and 20 cuts
    cfg = {"max_duration": 120, "max_cut_duration": 35, "num_buckets": 4, "buffer_size": 50}
    cfg["bucket_duration_bins"] = [12.0, 14.0, 16.0, 35.0]
    samplers = [
        build_sampler(WholeStream(p), cfg, rank=r, world_size=3) for r, p in enumerate(parts)
    ]
    steps = list(simulate_ranks(samplers))
    seen = Counter(c.id for step in steps for batch in step for c in batch)
    assert set(seen) == {c.id for c in cuts} and set(seen.values()) == {1}
    sizes = [[len(batch) for batch in step] for step in steps]
    for rank, part in enumerate(parts):  # a rank that has run out trains on nothing
        assert sum(s[rank] for s in sizes) == len(part)
        ran_out = [s[rank] == 0 for s in sizes]
        assert ran_out == sorted(ran_out)  # only once it is through its part
    assert all(len({n for n in s if n}) == 1 for s in sizes)  # as many cuts where not empty


def test_a_sampler_of_several_ranks_needs_torch_distributed(tiny_corpus) -> None:
    from asr.data.buckets import build_sampler
    from asr.data.corpus import load_cuts

    sampler = build_sampler(
        load_cuts(tiny_corpus.cuts("train-clean-100")), {"max_duration": 30}, world_size=2
    )
    with pytest.raises(RuntimeError, match="torch.distributed, which is not initialized"):
        next(iter(sampler))
