"""Training batches from lhotse Shar shards: each rank reads its own shards, in sequence.

A Shar source (a directory written by `asr-export-shar`, or its URL) is a list of numbered
shards, each one `cuts.NNNNNN.jsonl.gz` beside one tar per field (`recording.NNNNNN.tar`
or `features.NNNNNN.tar`). Random reads of millions of small files are what starves GPUs
on network storage; here every byte is read once per epoch, front to back.

Per epoch (`plan_epoch`): the shards of all sources are shuffled from (seed, epoch), the
same order on every rank, and dealt out to the ranks whole, round by round. When the
shards do not divide evenly among the ranks, the last, partial round's shards are read
by every rank, each keeping every world_size-th cut of them: nothing is dropped or
repeated (each cut is trained on once per epoch across the ranks), at the price of those
few shards being read world_size times.

Each rank's cuts go through the same bucketing sampler as cut manifests
(`asr.data.buckets.build_sampler`: 2D buckets, TPS filter, batch sizes), one per rank.
The ranks' streams differ, so their batches do too, and under DDP a rank that stops early
leaves the others waiting: before each epoch every rank works out every rank's batches
from the shards' cut lists alone (no audio is read) and from them one schedule
(`synchronized_schedule`): the same number of steps on every rank (empty batches where a
rank has run out), each step drawing from one bucket on every rank where each rank's next
`SYNC_WINDOW` batches hold one (a rank reads that far ahead and keeps those batches).

Faults: a shard whose tar is missing or truncated, or whose data does not match its cut
list, is named in a warning; its cuts that could not be read go on marked
`custom["unreadable_source"]`, so that the dataset skips and counts them against
`faults.max_skipped_fraction` like any unreadable file, and the batch counts stay those
the cut lists predicted. A member whose audio does not decode is skipped by the dataset.

The sampler runs in each rank's main process (the dataloader workers decode audio and
compute features); resuming inside an epoch replays that epoch's shard order and skips
the steps already trained on, reading (not decoding) the shards up to that point.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from lhotse import CutSet, fastcopy
from lhotse.cut import Cut
from lhotse.shar import LazySharIterator

from asr.data.augment import CutAugmenter
from asr.data.bins import equal_total_edges
from asr.data.buckets import SamplerConfig, build_sampler
from asr.data.corpus import load_cuts
from asr.data.dataset import SOURCE_SHARD, UNREADABLE_MARK
from asr.data.rank_sync import check_resumable
from asr.data.shar import shar_fields
from asr.data.tokenizer import Tokenizer
from asr.errors import first_line

log = logging.getLogger(__name__)

SYNC_WINDOW = 8  # batches a rank may read ahead to draw from the same bucket as the others

Shard = dict[str, str]  # field -> the shard's file, path or URL ("cuts" always present)
MANIFEST = "manifest"  # a Shard of one cut manifest instead: {MANIFEST: path}


@dataclass(frozen=True)
class ShardPart:
    """Shard `index` of the epoch, read whole (`every` 1) or keeping its cuts number
    `offset`, `offset + every`, ... (a shard shared by every rank)."""

    index: int
    every: int = 1
    offset: int = 0


def plan_epoch(
    num_shards: int, world_size: int, seed: int, epoch: int, shared: frozenset[int] = frozenset()
) -> list[list[ShardPart]]:
    """Per rank, the shard parts it reads in `epoch`, in order (see the module docstring).
    Shards in `shared` (cut manifests) are read by every rank, each keeping its share."""
    if num_shards < 1:
        raise ValueError("no Shar shards to read")
    order = list(range(num_shards))
    random.Random(f"shar-{seed}-{epoch}").shuffle(order)
    dealt = {i: k for k, i in enumerate(i for i in order if i not in shared)}  # -> its turn
    whole = len(dealt) - len(dealt) % world_size  # turns in full rounds
    plan: list[list[ShardPart]] = [[] for _ in range(world_size)]
    for i in order:
        if i in dealt and dealt[i] < whole:
            plan[dealt[i] % world_size].append(ShardPart(i))
        else:  # a cut manifest, or a shard of the last, partial round
            for rank in range(world_size):
                plan[rank].append(ShardPart(i, world_size, rank))
    return plan


def open_shards(sources: Sequence[str], fields: Sequence[str]) -> list[Shard]:
    """Every shard of `sources` (directories or http(s) URLs of directories), in order,
    with the files of `fields` (besides "cuts"); a source lacking a field is an error."""
    shards: list[Shard] = []
    for source in sources:
        found = shar_fields(source)
        missing = [f for f in ("cuts", *fields) if f not in found]
        if missing:
            raise ValueError(
                f"Shar source {source} has no {', '.join(missing)} shards (it has "
                f"{', '.join(sorted(found))}): write them with asr-export-shar --fields"
            )
        for i in range(len(found["cuts"])):
            shards.append({f: found[f][i] for f in ("cuts", *fields)})
    return shards


def manifest_shards(paths: Sequence[str]) -> list[Shard]:
    """Cut manifests read beside Shar shards: each one shard, shared by every rank (each
    keeps every world_size-th cut), its data read from the files its cuts name."""
    return [{MANIFEST: str(path)} for path in paths]


def mark_unreadable(cut: Cut, detail: str) -> Cut:
    """`cut` (from a shard's cut list) marked as unreadable, with why."""
    return fastcopy(cut, custom={**(cut.custom or {}), UNREADABLE_MARK: detail})


class ShardStream:
    """One rank's cuts of an epoch (`epoch`, set before iterating), shard after shard,
    with their data from the shards' tars (only their cut lists when `fields` is empty)."""

    def __init__(
        self,
        shards: list[Shard],
        fields: Sequence[str],
        *,
        rank: int,
        world_size: int,
        seed: int,
    ) -> None:
        self.shards, self.fields = shards, tuple(fields)
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.epoch = 0

    def __iter__(self) -> Iterator[Cut]:
        shared = frozenset(i for i, shard in enumerate(self.shards) if MANIFEST in shard)
        plan = plan_epoch(len(self.shards), self.world_size, self.seed, self.epoch, shared)
        for part in plan[self.rank]:
            for i, cut in enumerate(self._read(self.shards[part.index])):
                if i % part.every == part.offset:
                    yield cut

    def _read(self, shard: Shard) -> Iterator[Cut]:
        """The shard's cuts with their data; after a fault, the rest of its cut list
        marked unreadable (and nothing more when the cut list itself cannot be read)."""
        if MANIFEST in shard:
            yield from load_cuts(shard[MANIFEST])
            return
        read = 0
        files = ", ".join(shard[f] for f in ("cuts", *self.fields))
        try:
            fields = {f: [shard[f]] for f in ("cuts", *self.fields)}
            for cut in LazySharIterator(fields=fields):
                # where its data came from, should it not decode (the dataset names it)
                yield fastcopy(cut, custom={**(cut.custom or {}), SOURCE_SHARD: files})
                read += 1
            return
        except Exception as err:  # noqa: BLE001 - any fault of this shard's files
            detail = f"Shar shard {files}: {first_line(err)}"
        try:
            rest = list(LazySharIterator(fields={"cuts": [shard["cuts"]]}))[read:]
        except Exception as err:  # noqa: BLE001
            log.warning("%s; its cut list is unreadable too (%s): its cuts are lost", detail,
                        first_line(err))  # fmt: skip
            return
        log.warning("%s; %d of its %d cuts are skipped", detail, len(rest), read + len(rest))
        for cut in rest:
            yield mark_unreadable(cut, detail)


def with_estimated_bins(
    shards: list[Shard], cfg: SamplerConfig, speeds: Sequence[float] = (1.0,)
) -> SamplerConfig:
    """`cfg` with `num_buckets` duration bins of about equal total duration, from the cut
    lists of every shard (lhotse would estimate them from the stream, reading its audio),
    each cut at every one of `speeds` (the speed perturbation's factors), so that the last
    bin holds the slowest copy of the longest cut: no cut is lost to its own perturbation."""
    stream = ShardStream(shards, (), rank=0, world_size=1, seed=cfg.seed)
    durations = [
        cut.duration if factor == 1.0 else cut.perturb_speed(factor).duration
        for cut in stream
        for factor in speeds
    ]
    edges = equal_total_edges(durations, min(cfg.num_buckets, len(durations)))
    log.info("duration bins from the shards' cut lists (%d cuts): %s", len(durations), edges)
    return replace(cfg, bucket_duration_bins=tuple(edges))


def synchronized_schedule(buckets: Sequence[Sequence[int]], window: int) -> list[list[int | None]]:
    """The steps of an epoch: per step, the index of each rank's batch in its own order
    (None: an empty batch), from each rank's batch buckets in the order its sampler makes
    them. A step takes, on every rank, its earliest unused batch of one bucket, where
    every rank that has batches left holds one of that bucket among its `window` earliest
    unused ones (the candidates: each rank's earliest unused batch's bucket, in rank
    order); where none does, every rank takes its earliest unused batch. Every batch is
    used once; every rank takes the same number of steps (empty batches once it has
    none left); a rank never reads further ahead than `window` unused batches."""
    pending = [list(range(len(b))) for b in buckets]  # each rank's unused batches, in order
    steps: list[list[int | None]] = []
    while any(pending):
        live = [q for q, p in enumerate(pending) if p]
        chosen = None
        for q in live:
            bucket = buckets[q][pending[q][0]]
            if all(any(buckets[r][i] == bucket for i in pending[r][:window]) for r in live):
                chosen = bucket
                break
        step: list[int | None] = [None] * len(buckets)
        for r in live:
            if chosen is None:
                step[r] = pending[r].pop(0)
            else:
                at = next(k for k, i in enumerate(pending[r][:window]) if buckets[r][i] == chosen)
                step[r] = pending[r].pop(at)
        steps.append(step)
    return steps


class SharSampler:
    """This rank's mini-batches from Shar shards in an order all ranks agree on: the same
    number per epoch on every rank (empty ones where a rank has run out), drawn at each
    step from one bucket on every rank where each rank's next `window` batches allow it
    (`synchronized_schedule`, computed by every rank from the shards' cut lists alone).
    `set_epoch` (passed down to the shard stream and the bucketing sampler) and
    `load_state_dict(position)` as `asr.data.rank_sync.RankSynchronizedSampler` has them."""

    def __init__(
        self,
        shards: list[Shard],
        fields: Sequence[str],
        cfg: SamplerConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
        tokenizer: Tokenizer | None = None,
        window: int = SYNC_WINDOW,
        augmenter: CutAugmenter | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank}")
        if cfg.bucket_duration_bins is None:
            speed = augmenter.config.speed if augmenter is not None else None
            cfg = with_estimated_bins(shards, cfg, speed.factors if speed else (1.0,))
        self.shards, self.fields, self.cfg, self.tokenizer = shards, fields, cfg, tokenizer
        # sped-up cuts change the schedule; noise, rooms and volume do not
        self.schedule_augmenter = augmenter.durations_only() if augmenter is not None else None
        self.rank, self.world_size, self.window = rank, world_size, window
        self.stream = ShardStream(shards, fields, rank=rank, world_size=world_size, seed=cfg.seed)
        self.inner = build_sampler(
            CutSet(self.stream), cfg, tokenizer=tokenizer, augmenter=augmenter
        )
        self.cut_filter = self.inner.cut_filter
        self._skip = 0
        self._schedules: dict[int, list[list[int | None]]] = {}  # epoch -> its steps

    @property
    def epoch(self) -> int:
        return self.stream.epoch

    def bucket_of(self, batch: CutSet) -> int:
        """The bucket a batch was drawn from."""
        return self.inner.bucket_of(batch)

    def set_epoch(self, epoch: int) -> None:
        self.stream.epoch = epoch
        self.inner.set_epoch(epoch)

    def schedule(self, epoch: int | None = None) -> list[list[int | None]]:
        """`synchronized_schedule` of `epoch` (default: the current one): every rank's
        batches worked out from the shards' cut lists (no audio is read)."""
        epoch = self.epoch if epoch is None else epoch
        if epoch not in self._schedules:
            buckets = []
            for rank in range(self.world_size):
                stream = ShardStream(
                    self.shards, (), rank=rank, world_size=self.world_size, seed=self.cfg.seed
                )
                stream.epoch = epoch
                sampler = build_sampler(
                    CutSet(stream), self.cfg, tokenizer=self.tokenizer,
                    augmenter=self.schedule_augmenter,
                )  # fmt: skip
                sampler.set_epoch(epoch)
                buckets.append([sampler.bucket_of(batch) for batch in sampler])
            self._schedules = {epoch: synchronized_schedule(buckets, self.window)}
        return self._schedules[epoch]

    def batch_counts(self, epoch: int | None = None) -> list[int]:
        """Every rank's (non-empty) batch count in `epoch`."""
        steps = self.schedule(epoch)
        return [sum(step[q] is not None for step in steps) for q in range(self.world_size)]

    def __iter__(self) -> Iterator[CutSet]:
        skip, self._skip = self._skip, 0
        mine = [step[self.rank] for step in self.schedule()]
        self.inner.set_epoch(self.epoch)
        made = iter(self.inner)  # this rank's batches in their own order, read in sequence
        held: dict[int, CutSet] = {}  # read, not yet used (at most `window`)
        unused = {i for i in mine[skip:] if i is not None}
        next_index = 0
        for index in mine[skip:]:
            if index is None:
                yield CutSet.from_cuts([])
                continue
            while index not in held and next_index <= index:
                batch = next(made, None)
                if batch is None:
                    break
                if next_index in unused:  # batches of skipped steps are dropped
                    held[next_index] = batch
                next_index += 1
            if index not in held:  # the shards gave fewer batches than their cut lists
                log.warning("batch %d of rank %d is missing from its shards", index, self.rank)
                yield CutSet.from_cuts([])
                continue
            yield held.pop(index)

    def __len__(self) -> int:
        return len(self.schedule())

    def load_state_dict(self, position: dict[str, Any]) -> None:
        """Resume at `position` ({epoch, steps_done, world_size}), as
        `RankSynchronizedSampler.load_state_dict` does."""
        check_resumable(position, self.world_size)
        self.set_epoch(position["epoch"])
        self._skip = position["steps_done"]
