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

Each rank's cuts are its part (`ShardStream`, a `asr.data.rank_sync.RankPart`): they go
through the same bucketing sampler as cut manifests (`asr.data.buckets.build_sampler`: 2D
buckets, TPS filter, batch sizes), which keeps the ranks in step by agreeing on every
step's bucket and batch size (`asr.data.rank_sync`).

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

from lhotse import fastcopy
from lhotse.cut import Cut
from lhotse.shar import LazySharIterator

from asr.data.augment import CutAugmenter
from asr.data.buckets import SamplerConfig, build_sampler, estimated_bins
from asr.data.corpus import load_cuts
from asr.data.dataset import SOURCE_SHARD, UNREADABLE_MARK
from asr.data.rank_sync import RankSynchronizedSampler
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
    """One rank's cuts of an epoch, shard after shard (`plan_epoch`): with their data from
    the shards' tars of `fields` (`cuts`), or from their cut lists alone (`cut_lists`)."""

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

    def cuts(self, epoch: int) -> Iterator[Cut]:
        return self._cuts(epoch, self.fields)

    def cut_lists(self, epoch: int) -> Iterator[Cut]:
        return self._cuts(epoch, ())

    def _cuts(self, epoch: int, fields: Sequence[str]) -> Iterator[Cut]:
        shared = frozenset(i for i, shard in enumerate(self.shards) if MANIFEST in shard)
        plan = plan_epoch(len(self.shards), self.world_size, self.seed, epoch, shared)
        for part in plan[self.rank]:
            for i, cut in enumerate(self._read(self.shards[part.index], fields)):
                if i % part.every == part.offset:
                    yield cut

    def _read(self, shard: Shard, fields: Sequence[str]) -> Iterator[Cut]:
        """The shard's cuts with their data; after a fault, the rest of its cut list
        marked unreadable (and nothing more when the cut list itself cannot be read)."""
        if MANIFEST in shard:
            yield from load_cuts(shard[MANIFEST])
            return
        read = 0
        files = ", ".join(shard[f] for f in ("cuts", *fields))
        try:
            for cut in LazySharIterator(fields={f: [shard[f]] for f in ("cuts", *fields)}):
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
    shards: list[Shard], cfg: SamplerConfig, augmenter: CutAugmenter | None = None
) -> SamplerConfig:
    """`cfg` with duration bins estimated from the first cuts of the shards' cut lists, in
    their order (`asr.data.buckets.estimated_bins`: the same on every rank; lhotse would
    estimate them from the stream, reading its audio)."""
    cut_lists = ShardStream(shards, (), rank=0, world_size=1, seed=cfg.seed).cut_lists(0)
    return replace(cfg, bucket_duration_bins=estimated_bins(cut_lists, cfg, augmenter))


def shard_sampler(
    shards: list[Shard],
    fields: Sequence[str],
    cfg: SamplerConfig,
    *,
    rank: int = 0,
    world_size: int = 1,
    tokenizer: Tokenizer | None = None,
    augmenter: CutAugmenter | None = None,
) -> RankSynchronizedSampler:
    """This rank's training batches from its Shar shards (`build_sampler` over its
    `ShardStream`), the bins estimated from the cut lists when `cfg` has none."""
    if cfg.bucket_duration_bins is None:
        cfg = with_estimated_bins(shards, cfg, augmenter)
    stream = ShardStream(shards, fields, rank=rank, world_size=world_size, seed=cfg.seed)
    return build_sampler(
        stream, cfg, rank=rank, world_size=world_size, tokenizer=tokenizer, augmenter=augmenter
    )
