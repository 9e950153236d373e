"""Every data-parallel rank in step, for cut manifests and Shar shards alike.

Under DDP every step waits for the slowest rank, so the ranks' batches should cost the
same. Each rank reads only its own part of the data (`RankPart`: its slice of a manifest,
`ManifestSlice`, whose cuts of each bucket are dealt out in turn, or its shards,
`asr.data.shar_sampler.ShardStream`) into bucket buffers of its own (`RankBuffers`: about
`buffer_size` cuts, each in its bucket at a random place).
Before each step the ranks exchange a summary of their buffers, one small all-gather over
a gloo group of their own (per window of adjacent buckets: how many cuts its next batch
takes, whether that batch is full, how many cuts wait in it), and every rank makes the
same decision from the same table and a shared seed (`Agreement.decide`):

1. a bucket whose next batch is full on every rank, drawn at random in proportion to the
   cuts waiting in it over all ranks; every rank takes as many cuts from it as the fewest
   any rank's batch holds, so the batches differ only by their longest cut, inside one
   bucket;
2. where no bucket is full on every rank, the ranks read further first (up to half a
   buffer more, an eighth at a time): shards of one speaker or book can leave a bucket
   short on one rank for a while;
3. then windows of 2, 4, 8, ... adjacent buckets (their highest bucket's cuts first, the
   smallest of their batch sizes), until one gives a full batch on every rank: at the end
   of an epoch the ranks' leftovers differ bucket by bucket;
4. with every bucket in one window and still no full batch on every rank (the epoch's
   last steps), as many cuts on every rank as the one with the fewest has; once some rank
   has none left, it gets an empty batch (it trains on nothing that step; no cut is
   repeated).

So every rank takes the same number of steps and every cut is trained on exactly once per
epoch (`drop_last` instead ends the epoch at the first step with no full batch on every
rank once every stream has ended, dropping what is left). Without `sync` each rank draws
its own bucket (for comparison): the step counts still agree. `simulate_ranks` steps every
rank's sampler in one process, as the batching benchmark and the tests do.

A run resumes inside an epoch from a `ResumePosition` (the steps Lightning counted), which
replays that epoch's decisions on the same data and skips the steps already trained on.

Evaluation (`EvalSplit`) needs no buckets but two other guarantees: every cut exactly once
(a duplicate would count twice in the WER) and the same number of batches on every rank
(DDP's forward may run a collective, so a rank that stops early would leave the others
waiting). Ranks left without a batch in the last round get an empty one.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from lhotse import CutSet
from lhotse.cut import Cut
from lhotse.dataset.sampling.base import SamplingConstraint

READ_AHEAD_LIMIT = 0.5  # of buffer_size: how much further than its buffer a rank may read
READ_AHEAD_STEP = 0.125  # of buffer_size: read this much more each time no bucket is full


@dataclass(frozen=True)
class ResumePosition:
    """Where training resumes: `steps_done` steps into `epoch`, as Lightning's loop counted
    them, with `world_size` processes."""

    epoch: int
    steps_done: int = 0
    world_size: int = 1


def check_resumable(position: ResumePosition, world_size: int) -> None:
    """Raise unless `position` can resume with `world_size` processes: inside an epoch only
    the same number splits its data the same way (skipping `steps_done` steps of other
    batches would skip the wrong cuts)."""
    if position.steps_done and position.world_size != world_size:
        raise ValueError(
            f"the checkpoint stopped inside epoch {position.epoch} after "
            f"{position.steps_done} steps of {position.world_size} data-parallel "
            f"process(es); this run has {world_size}, which would split that epoch's data "
            f"differently. Resume with {position.world_size} process(es) (trainer.devices x "
            f"trainer.num_nodes), or from an end-of-epoch checkpoint "
            f"(resume=.../checkpoints/epoch=NN.ckpt), which any number of processes can "
            f"continue."
        )


def check_rank(rank: int, world_size: int) -> None:
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank}")


class RankPart(Protocol):
    """One rank's cuts of an epoch, in the order it reads them."""

    def cuts(self, epoch: int) -> Iterable[Cut]:
        """The cuts, with their data where they carry it (Shar shards)."""
        ...

    def cut_lists(self, epoch: int) -> Iterable[Cut]:
        """The same cuts without reading their data (to count an epoch's steps)."""
        ...


class CutAdmission(Protocol):
    """Which cuts a sampler takes (`asr.data.buckets.CutFilter`), counting the others."""

    def __call__(self, cut: Cut) -> bool: ...

    def counts(self) -> dict[str, int]:
        """Reason -> distinct cuts dropped so far."""
        ...


class WholeStream:
    """Cuts as one part, every one in order: a manifest that one rank reads whole, or a
    rank's own cuts already set apart."""

    def __init__(self, cuts: Iterable[Cut]) -> None:
        self.stream = cuts

    def cuts(self, epoch: int) -> Iterator[Cut]:
        return iter(self.stream)

    def cut_lists(self, epoch: int) -> Iterator[Cut]:
        return iter(self.stream)


class ManifestSlice:
    """Rank `rank`'s slice of a stream that every rank parses (`part`: a manifest, its cuts
    prepared for bucketing): the k-th cut of each bucket goes to rank k mod world_size, so
    that every rank's buckets fill alike (`deal_key(cut)`: its bucket, or None for a cut the
    sampler will drop; those are dealt out in turn too). Only the slice's data is read."""

    def __init__(
        self,
        part: RankPart,
        deal_key: Callable[[Cut], int | None],
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        check_rank(rank, world_size)
        self.part, self.deal_key, self.rank, self.world_size = part, deal_key, rank, world_size

    def cuts(self, epoch: int) -> Iterator[Cut]:
        return self._slice(self.part.cuts(epoch))

    def cut_lists(self, epoch: int) -> Iterator[Cut]:
        return self._slice(self.part.cut_lists(epoch))

    def _slice(self, cuts: Iterable[Cut]) -> Iterator[Cut]:
        dealt: dict[int | None, int] = {}  # bucket -> its cuts so far
        for cut in cuts:
            key = self.deal_key(cut)
            turn = dealt.get(key, 0)
            dealt[key] = turn + 1
            if turn % self.world_size == self.rank:
                yield cut


@dataclass(frozen=True)
class Bucketing:
    """How a rank's cuts become batches: `bucket_of(cut)` in [0, num_buckets), and
    `new_batch()`, the constraint of an empty batch, from one bucket or adjacent ones
    (lhotse's `SamplingConstraint`: full by a cut count or by padded seconds); the buffer's
    size, in-bucket shuffling, `drop_last`, the seed that every rank shares, and whether
    the ranks draw from the same buckets (`sync`)."""

    num_buckets: int
    bucket_of: Callable[[Cut], int]
    new_batch: Callable[[], SamplingConstraint]
    buffer_size: int = 20_000
    shuffle: bool = True
    drop_last: bool = False
    seed: int = 0
    sync: bool = True


def next_batch_size(cuts: Iterable[Cut], constraint: SamplingConstraint) -> tuple[int, bool]:
    """How many of `cuts`, in order, one batch under `constraint` takes (at least one), and
    whether that batch is full (the next cut would not fit, or nearly)."""
    taken = 0
    for taken, cut in enumerate(cuts, 1):
        constraint.add(cut)
        if constraint.exceeded():
            return max(taken - 1, 1), True
        if constraint.close_to_exceeding():
            return taken, True
    return taken, False


class RankBuffers:
    """One rank's bucket buffers over its cut stream: `summary` reads up to a number of
    held cuts and describes the next batch of each window of adjacent buckets, `take`
    removes a batch from one window (its highest bucket's cuts first)."""

    def __init__(
        self,
        cuts: Iterable[Cut],
        bucketing: Bucketing,
        rng: random.Random,
        admit: Callable[[Cut], bool],
    ) -> None:
        self.source, self.bucketing, self.rng, self.admit = iter(cuts), bucketing, rng, admit
        self.buckets: list[list[Cut]] = [[] for _ in range(bucketing.num_buckets)]
        self.held = 0
        self.exhausted = False
        self._next: dict[int, tuple[int, bool]] = {}  # bucket -> next_batch_size, while unchanged

    def fill(self, size: int) -> None:
        """Read cuts until `size` are held or the stream ends."""
        while self.held < size and not self.exhausted:
            cut = next(self.source, None)
            if cut is None:
                self.exhausted = True
            elif self.admit(cut):
                index = self.bucketing.bucket_of(cut)
                bucket = self.buckets[index]
                at = self.rng.randint(0, len(bucket)) if self.bucketing.shuffle else len(bucket)
                bucket.insert(at, cut)
                self.held += 1
                self._next.pop(index, None)

    def window(self, start: int, width: int) -> Iterator[Cut]:
        """The cuts of buckets start .. start + width - 1, the highest bucket's first."""
        for index in reversed(range(start, start + width)):
            yield from self.buckets[index]

    def summary(self, size: int, width: int = 1) -> np.ndarray:
        """After `fill(size)`, per window of `width` adjacent buckets (W = num_buckets -
        width + 1 of them): its next batch's cuts, whether that batch is full, the cuts
        waiting in it; then whether the stream has ended (3 x W + 1 ints)."""
        self.fill(size)
        count = self.bucketing.num_buckets - width + 1
        row = np.zeros(3 * count + 1, dtype=np.int64)
        for start in range(count):
            waiting = sum(len(self.buckets[b]) for b in range(start, start + width))
            if not waiting:
                continue
            if width == 1:
                if start not in self._next:
                    constraint = self.bucketing.new_batch()
                    self._next[start] = next_batch_size(self.buckets[start], constraint)
                row[start], row[count + start] = self._next[start]
            else:
                constraint = self.bucketing.new_batch()
                row[start], row[count + start] = next_batch_size(
                    self.window(start, width), constraint
                )
            row[2 * count + start] = waiting
        row[3 * count] = self.exhausted
        return row

    def take(self, start: int, width: int, size: int) -> CutSet:
        """The first `size` cuts of the window (none for size 0), removed."""
        taken: list[Cut] = []
        for index in reversed(range(start, start + width)):
            if len(taken) == size:
                break
            cuts = self.buckets[index]
            more = cuts[: size - len(taken)]
            if more:
                del cuts[: len(more)]
                taken += more
                self._next.pop(index, None)
        self.held -= len(taken)
        return CutSet.from_cuts(taken)


@dataclass(frozen=True)
class Step:
    """What each rank takes at one step: per rank (first bucket, buckets, cuts) of a window
    of adjacent buckets; 0 cuts: an empty batch."""

    takes: tuple[tuple[int, int, int], ...]


READ_MORE = "read more"  # `Agreement.decide`: the ranks should read further, then summarize


class Agreement:
    """The decision that every rank makes alike from the table of all ranks' summaries
    (rows of `RankBuffers.summary` at `width`) and the shared seed: see the module
    docstring."""

    def __init__(self, bucketing: Bucketing, world_size: int, epoch: int) -> None:
        self.bucketing, self.world_size = bucketing, world_size
        # without shuffling every epoch draws its buckets alike
        self.rng = random.Random(f"rank-sync-{bucketing.seed}-{epoch if bucketing.shuffle else 0}")
        self.read_ahead = 0  # cuts beyond buffer_size the ranks read now
        self.read_ahead_limit = int(READ_AHEAD_LIMIT * bucketing.buffer_size)
        self.read_ahead_step = max(1, int(READ_AHEAD_STEP * bucketing.buffer_size))
        self.width = 1  # adjacent buckets a batch may draw from now

    @property
    def buffer_target(self) -> int:
        """How many cuts each rank holds before it summarizes its buffers."""
        return self.bucketing.buffer_size + self.read_ahead

    def decide(self, table: np.ndarray) -> Step | str | None:
        """A `Step`, `READ_MORE` (summarize again, after reading further or over wider
        windows), or None when the epoch is over."""
        count = (table.shape[1] - 1) // 3
        fits, full = table[:, :count], table[:, count : 2 * count] > 0
        waiting, exhausted = table[:, 2 * count : 3 * count], bool(table[:, 3 * count].all())
        if not self.bucketing.sync:
            return self._each_its_own(fits, full, waiting, exhausted)
        ready = np.flatnonzero(full.all(axis=0))
        if len(ready):
            weights = waiting[:, ready].sum(axis=0).tolist()
            start = int(self.rng.choices(ready.tolist(), weights=weights)[0])
            step = self._same(start, int(fits[:, start].min()))
            if self.width == 1:
                self.read_ahead = 0
            self.width = 1
            return step
        if self.width == 1 and not exhausted and self.read_ahead < self.read_ahead_limit:
            self.read_ahead += self.read_ahead_step
            return READ_MORE
        if exhausted and self.bucketing.drop_last:
            return None
        if self.width < self.bucketing.num_buckets:
            self.width = min(2 * self.width, self.bucketing.num_buckets)
            return READ_MORE
        # one window holds every bucket, and not every rank fills a batch from it
        self.width = 1
        common = int(fits[:, 0].min())
        if common:  # every rank has cuts: as many from each
            return self._same(0, common, self.bucketing.num_buckets)
        if not fits.any():
            return None  # every buffer is empty (and every stream has ended)
        size = int(fits[fits[:, 0] > 0, 0].min())
        takes = [(0, self.bucketing.num_buckets, size if fit else 0) for fit in fits[:, 0]]
        return Step(tuple(takes))

    def _same(self, start: int, size: int, width: int | None = None) -> Step:
        return Step(((start, width or self.width, size),) * self.world_size)

    def _each_its_own(
        self, fits: np.ndarray, full: np.ndarray, waiting: np.ndarray, exhausted: bool
    ) -> Step | None:
        """Without `sync`: each rank's own bucket, drawn among its full ones (among its
        non-empty ones once it has no full one) in proportion to their waiting cuts."""
        if not fits.any() or (self.bucketing.drop_last and exhausted and not full.any()):
            return None
        takes = []
        for rank in range(len(fits)):
            candidates = np.flatnonzero(full[rank] if full[rank].any() else fits[rank])
            if not len(candidates):
                takes.append((0, 1, 0))
                continue
            weights = waiting[rank, candidates].tolist()
            bucket = int(self.rng.choices(candidates.tolist(), weights=weights)[0])
            takes.append((bucket, 1, int(fits[rank, bucket])))
        return Step(tuple(takes))


Gather = Callable[[list[np.ndarray]], np.ndarray]  # the local ranks' rows -> every rank's


def synchronized_steps(
    buffers: dict[int, RankBuffers], agreement: Agreement, gather: Gather
) -> Iterator[list[CutSet]]:
    """The epoch's steps: at each, the batch of each rank in `buffers` (rank -> its
    buffers; every rank in one process to simulate them, or this process's own), agreed
    from `gather`ed summaries."""
    while True:
        target, width = agreement.buffer_target, agreement.width
        table = gather([b.summary(target, width) for b in buffers.values()])
        decision = agreement.decide(table)
        if decision is None:
            return
        if decision is READ_MORE:
            continue
        yield [buffers[r].take(*decision.takes[r]) for r in buffers]


class ProcessGroupGather:
    """All-gathers each rank's summary row over a gloo process group of its own, made on
    first use (every rank reaches it at the same point: its first step or step count)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.group: Any = None

    def __call__(self, rows: list[np.ndarray]) -> np.ndarray:
        if self.group is None:
            if not (dist.is_available() and dist.is_initialized()):
                raise RuntimeError(
                    f"a training sampler for {self.world_size} ranks agrees on every step "
                    "with the other ranks over torch.distributed, which is not "
                    "initialized: iterate it inside trainer.fit, or simulate the ranks in "
                    "one process with asr.data.rank_sync.simulate_ranks"
                )
            if dist.get_world_size() != self.world_size:
                raise RuntimeError(
                    f"the training sampler was built for {self.world_size} ranks, but "
                    f"torch.distributed has {dist.get_world_size()}"
                )
            self.group = dist.new_group(backend="gloo")
        (row,) = rows
        mine = torch.from_numpy(row)
        every = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(every, mine, group=self.group)
        return torch.stack(every).numpy()


def local_gather(rows: list[np.ndarray]) -> np.ndarray:
    """Every rank's row already at hand (one process, or ranks simulated in one)."""
    return np.stack(rows)


class RankSynchronizedSampler:
    """This rank's mini-batches (CutSets), in step with every other rank's (see the module
    docstring): `part` is this rank's cuts, `cut_filter(cut)` admits a cut (and counts the
    ones it drops: `cut_filter.counts()`), `bucketing` makes the batches.

    `set_epoch(epoch)` chooses the next iteration's epoch; `resume_from(position)` makes the
    next iteration that epoch's without its first `steps_done` steps; `count_steps(epoch)`
    counts an epoch's steps from the cut lists alone. With `world_size` > 1 each of these
    runs one small collective per step, so every rank must call them alike.
    """

    def __init__(
        self,
        part: RankPart,
        bucketing: Bucketing,
        *,
        cut_filter: CutAdmission,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        check_rank(rank, world_size)
        self.part, self.bucketing, self.cut_filter = part, bucketing, cut_filter
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self._resume: ResumePosition | None = None
        self._gather: Gather = local_gather if world_size == 1 else ProcessGroupGather(world_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self._resume is not None and epoch > self._resume.epoch:
            # the resumed epoch ended without a batch drawn (its last step was done)
            self._resume = None

    def bucket_of(self, batch: CutSet) -> int:
        """The bucket of a batch's first cut (of its highest bucket)."""
        return self.bucketing.bucket_of(next(iter(batch)))

    def resume_from(self, position: ResumePosition) -> None:
        """Make the next iteration `position.epoch`'s, without its first `steps_done` steps."""
        check_resumable(position, self.world_size)
        self._resume = position

    def __iter__(self) -> Iterator[CutSet]:
        # A generator: nothing happens until the first batch is asked for, so a probing
        # iter() neither consumes the resume position nor runs a collective.
        position, self._resume = self._resume, None
        if position is not None:
            # Lightning draws a resumed run's first batch before it sets the epoch.
            self.epoch = position.epoch
        skip = position.steps_done if position is not None else 0
        for index, batch in enumerate(self._batches(self.part.cuts(self.epoch), self.epoch)):
            if index >= skip:
                yield batch

    def count_steps(self, epoch: int = 0) -> int:
        """The steps of `epoch`, decided from the cut lists (no audio is read)."""
        return sum(1 for _ in self._batches(self.part.cut_lists(epoch), epoch))

    def _batches(self, cuts: Iterable[Cut], epoch: int) -> Iterator[CutSet]:
        buffers = self.buffers(cuts, epoch)
        agreement = Agreement(self.bucketing, self.world_size, epoch)
        for (batch,) in synchronized_steps({self.rank: buffers}, agreement, self._gather):
            yield batch

    def buffers(self, cuts: Iterable[Cut], epoch: int) -> RankBuffers:
        """This rank's buffers over `cuts` in `epoch` (its own shuffling seed)."""
        rng = random.Random(f"rank-buffers-{self.bucketing.seed}-{epoch}-{self.rank}")
        return RankBuffers(cuts, self.bucketing, rng, admit=self.cut_filter)


def simulate_ranks(
    samplers: Sequence[RankSynchronizedSampler], epoch: int = 0, cut_lists: bool = True
) -> Iterator[list[CutSet]]:
    """Every rank's sampler (rank r at index r) stepped together in this process, without
    collectives: each step's batches of all ranks, as a training run would draw them."""
    world_size = len(samplers)
    if [s.rank for s in samplers] != list(range(world_size)):
        raise ValueError("simulate_ranks needs the samplers of ranks 0, 1, ... in order")
    buffers = {
        s.rank: s.buffers(s.part.cut_lists(epoch) if cut_lists else s.part.cuts(epoch), epoch)
        for s in samplers
    }
    agreement = Agreement(samplers[0].bucketing, world_size, epoch)
    yield from synchronized_steps(buffers, agreement, local_gather)


class EvalSplit:
    """Rank `rank`'s share of `sampler`'s batches (an iterable of CutSets): batches rank,
    rank + world_size, ...; in the last round ranks without a batch get an empty CutSet."""

    def __init__(self, sampler: Any, *, rank: int = 0, world_size: int = 1) -> None:
        check_rank(rank, world_size)
        self.sampler, self.rank, self.world_size = sampler, rank, world_size

    def __iter__(self) -> Iterator[CutSet]:
        index = -1
        for index, batch in enumerate(self.sampler):
            if index % self.world_size == self.rank:
                yield batch
        if (index + 1) % self.world_size and self.rank >= (index + 1) % self.world_size:
            yield CutSet.from_cuts([])
