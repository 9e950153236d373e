"""Split one stream of bucketed mini-batches across data-parallel ranks, optionally so that
every rank draws from the same bucket at every step.

Every rank runs the same single-process bucketing sampler (same seed, same epoch), so all
ranks see the same global sequence of batches, and each keeps its share of it. lhotse does
the same, but its `sync_buckets` only re-draws the same bucket index per step: when that
bucket has run short after the first rank's batch, the next rank's batch comes from a
neighbouring bucket (about 1 step in 10 in our measurements). Here a step is only formed
once its bucket has produced one batch per rank, so the buckets match at every step; the
step's cuts are then dealt out evenly (a bucket's last batch is usually partial, and a
rank with 1 cut beside ranks with 40 would waste their time).

At the end of an epoch a bucket may hold fewer batches than ranks: their cuts are dealt
out to all ranks (duplicating cuts, with lhotse's `_dup` id suffix, only when there are
fewer cuts than ranks), so nothing is dropped unless `drop_last`.

Evaluation (`EvalSplit`) needs no buckets but two other guarantees: every cut exactly once
(a duplicate would count twice in the WER) and the same number of batches on every rank
(DDP's forward may run a collective, so a rank that stops early would leave the others
waiting). Ranks left without a batch in the last round get an empty one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from lhotse import CutSet
from lhotse.cut import Cut


def deal_out(batches: list[CutSet], world_size: int) -> list[CutSet]:
    """The cuts of `batches` dealt into `world_size` non-empty batches (longest first, so
    each part gets cuts of similar length); cuts are repeated only if there are too few."""
    cuts: list[Cut] = sorted((c for b in batches for c in b), key=lambda c: -c.duration)
    repeat = 0
    while len(cuts) < world_size:
        repeat += 1
        cuts += [c.with_id(f"{c.id}_dup{repeat}") for c in cuts[: world_size - len(cuts)]]
    return [CutSet.from_cuts(cuts[r::world_size]) for r in range(world_size)]


class RankSynchronizedSampler:
    """This rank's mini-batches from a shared `sampler` (iterable of CutSet batches with
    `set_epoch` and `epoch`). `bucket_of(batch)` names a batch's bucket; with `sync` each
    step's batches share it, without it rank r simply takes every world_size-th batch.

    `set_epoch(epoch)` passes the epoch down: to `sampler` and to each of `epoch_followers`
    (what its cuts are drawn from, such as `asr.data.augment.AugmentedCuts`).
    `load_state_dict(position)` makes the next iteration replay that epoch's batch order
    and skip the steps already trained (metadata only): the one way a run resumes inside an
    epoch (the data module hands it the checkpoint's position, counted by Lightning).
    """

    def __init__(
        self,
        sampler: Any,
        bucket_of: Callable[[CutSet], int],
        *,
        rank: int = 0,
        world_size: int = 1,
        sync: bool = True,
        drop_last: bool = False,
        epoch_followers: Sequence[Any] = (),
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank}")
        self.sampler, self.bucket_of = sampler, bucket_of
        self.rank, self.world_size, self.sync, self.drop_last = rank, world_size, sync, drop_last
        self.epoch_followers = tuple(epoch_followers)
        self._skip = 0
        self.cut_filter: Any = None  # set by build_sampler: counts the dropped cuts

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)
        for follower in self.epoch_followers:
            follower.set_epoch(epoch)

    def steps(self) -> Iterator[list[CutSet]]:
        """Every step of the epoch as the list of all ranks' batches."""
        if self.world_size == 1:
            yield from ([batch] for batch in self.sampler)
            return
        pending: dict[int, list[CutSet]] = {}
        for batch in self.sampler:
            key = self.bucket_of(batch) if self.sync else 0
            group = pending.setdefault(key, [])
            group.append(batch)
            if len(group) == self.world_size:
                # Dealing evens out a bucket's last, partial batch against the full ones.
                batches = pending.pop(key)
                yield deal_out(batches, self.world_size) if self.sync else batches
        if self.drop_last:
            return
        for key in sorted(pending):
            yield deal_out(pending[key], self.world_size)

    def __iter__(self) -> Iterator[CutSet]:
        skip, self._skip = self._skip, 0
        for taken, step in enumerate(self.steps(), 1):
            if taken > skip:
                yield step[self.rank]

    def load_state_dict(self, position: dict[str, int]) -> None:
        """Resume at `position` ({epoch, steps_done, world_size}): the next iteration is
        that epoch's, without its first `steps_done` steps."""
        check_resumable(position, self.world_size)
        self.set_epoch(position["epoch"])
        self._skip = position["steps_done"]


def check_resumable(state: dict[str, int], world_size: int) -> None:
    """Raise unless a position {epoch, steps_done, world_size} can resume with
    `world_size` processes: inside an epoch only the same number splits its batches the
    same way (skipping `steps_done` of other batches would skip the wrong cuts)."""
    saved = state.get("world_size", world_size)
    if state.get("steps_done") and saved != world_size:
        raise ValueError(
            f"the checkpoint stopped inside epoch {state['epoch']} after "
            f"{state['steps_done']} steps of {saved} data-parallel process(es); this run "
            f"has {world_size}, which would split that epoch's batches differently. Resume "
            f"with {saved} process(es) (trainer.devices x trainer.num_nodes), or from an "
            f"end-of-epoch checkpoint (resume=.../checkpoints/epoch=NN.ckpt), which any "
            f"number of processes can continue."
        )


class EvalSplit:
    """Rank `rank`'s share of `sampler`'s batches (an iterable of CutSets): batches rank,
    rank + world_size, ...; in the last round ranks without a batch get an empty CutSet."""

    def __init__(self, sampler: Any, *, rank: int = 0, world_size: int = 1) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank}")
        self.sampler, self.rank, self.world_size = sampler, rank, world_size

    def __iter__(self) -> Iterator[CutSet]:
        index = -1
        for index, batch in enumerate(self.sampler):
            if index % self.world_size == self.rank:
                yield batch
        if (index + 1) % self.world_size and self.rank >= (index + 1) % self.world_size:
            yield CutSet.from_cuts([])
