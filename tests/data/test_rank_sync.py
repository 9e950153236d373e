from collections import Counter

import pytest
from lhotse import CutSet
from lhotse.testing.dummies import dummy_cut

from asr.data.rank_sync import EvalSplit


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
