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
(`asr.data.buckets.build_sampler`: 2D buckets, TPS filter, batch sizes), one per rank,
the bucket of each step drawn from a generator seeded alike on every rank. The ranks'
streams differ, so their batch counts do too, and under DDP a rank that stops early
leaves the others waiting: before each epoch every rank works out every rank's batch
count from the shards' cut lists alone (no audio is read) and the ranks with fewer
batches end the epoch with empty ones (a zero loss, the step still taken together).

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

from asr.data.bins import equal_total_edges
from asr.data.buckets import SamplerConfig, build_sampler
from asr.data.corpus import load_cuts
from asr.data.dataset import SOURCE_SHARD, UNREADABLE_MARK
from asr.data.rank_sync import check_resumable
from asr.data.shar import shar_fields
from asr.data.tokenizer import Tokenizer
from asr.errors import first_line

log = logging.getLogger(__name__)

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
        log.warning("%s; its %d cuts from the %dth on are skipped", detail, len(rest), read + 1)
        for cut in rest:
            yield mark_unreadable(cut, detail)


def with_estimated_bins(shards: list[Shard], cfg: SamplerConfig) -> SamplerConfig:
    """`cfg` with `num_buckets` duration bins of about equal total duration, from the cut
    lists of every shard (lhotse would estimate them from the stream, reading its audio)."""
    stream = ShardStream(shards, (), rank=0, world_size=1, seed=cfg.seed)
    durations = [cut.duration for cut in stream]
    edges = equal_total_edges(durations, min(cfg.num_buckets, len(durations)))
    log.info("duration bins from the shards' cut lists (%d cuts): %s", len(durations), edges)
    return replace(cfg, bucket_duration_bins=tuple(edges))


class SharSampler:
    """This rank's mini-batches from Shar shards, as many per epoch as every other rank's
    (empty ones at the end where it has fewer), with `set_epoch`, `state_dict` and
    `load_state_dict` as `asr.data.rank_sync.RankSynchronizedSampler` has them."""

    def __init__(
        self,
        shards: list[Shard],
        fields: Sequence[str],
        cfg: SamplerConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank}")
        if cfg.bucket_duration_bins is None:
            cfg = with_estimated_bins(shards, cfg)
        self.shards, self.fields, self.cfg, self.tokenizer = shards, fields, cfg, tokenizer
        self.rank, self.world_size = rank, world_size
        self.stream = ShardStream(shards, fields, rank=rank, world_size=world_size, seed=cfg.seed)
        self.inner = build_sampler(CutSet(self.stream), cfg, tokenizer=tokenizer)
        self.cut_filter = self.inner.cut_filter
        self.steps_done = 0
        self._skip = 0
        self._lengths: dict[int, list[int]] = {}  # epoch -> every rank's batch count

    @property
    def epoch(self) -> int:
        return self.stream.epoch

    def bucket_of(self, batch: CutSet) -> int:
        """The bucket a batch was drawn from."""
        return self.inner.bucket_of(batch)

    def set_epoch(self, epoch: int) -> None:
        self.stream.epoch = epoch
        self.inner.set_epoch(epoch)

    def batch_counts(self, epoch: int | None = None) -> list[int]:
        """Every rank's batch count in `epoch` (default: the current one), from the shards'
        cut lists alone."""
        epoch = self.epoch if epoch is None else epoch
        if epoch not in self._lengths:
            counts = []
            for rank in range(self.world_size):
                stream = ShardStream(
                    self.shards, (), rank=rank, world_size=self.world_size, seed=self.cfg.seed
                )
                stream.epoch = epoch
                sampler = build_sampler(CutSet(stream), self.cfg, tokenizer=self.tokenizer)
                sampler.set_epoch(epoch)
                counts.append(sum(1 for _ in sampler))
            self._lengths = {epoch: counts}
        return self._lengths[epoch]

    def __iter__(self) -> Iterator[CutSet]:
        skip, self._skip = self._skip, 0
        steps = max(self.batch_counts())
        self.inner.load_state_dict({"epoch": self.epoch, "steps_done": skip, "world_size": 1})
        self.steps_done = skip
        for batch in self.inner:
            self.steps_done += 1
            yield batch
        self.steps_done = max(self.steps_done, self.inner.steps_done)
        while self.steps_done < steps:  # this rank has fewer batches than another
            self.steps_done += 1
            yield CutSet.from_cuts([])

    def __len__(self) -> int:
        return max(self.batch_counts())

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "steps_done": self.steps_done, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_resumable(state, self.world_size)
        self.set_epoch(state["epoch"])
        self._skip = state["steps_done"]
