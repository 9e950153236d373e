"""Bucketing: the sampler that groups utterances of similar length.

`build_sampler` puts the keys of the `data.sampler` config behind one sampler for manifests
and Shar shards alike: buckets of lhotse constraints (`BucketConstraint`: 1D or 2D bins,
duration x tokens, with fixed per-bucket batch sizes or lhotse's padded-seconds budget),
tokens-per-second (TPS) filtering whose drops are counted per reason, and every
data-parallel rank in step, each reading only its own data (`asr.data.rank_sync`: lhotse's
`DynamicBucketingSampler` cannot agree on each step across ranks that read different
data, so its bucketing is not used). Bins are upper edges (see `asr.data.bins`).
"""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from lhotse import CutSet
from lhotse.cut import Cut
from lhotse.dataset import DynamicCutSampler
from lhotse.dataset.sampling.base import SamplingConstraint, TimeConstraint

from asr.config_keys import checked_keys
from asr.data.augment import CutAugmenter
from asr.data.bins import Bin, CutLengths, bin_index, duration_index, equal_total_edges, read_bins
from asr.data.corpus import cut_text
from asr.data.rank_sync import (
    Bucketing,
    EvalSplit,
    ManifestSlice,
    RankPart,
    RankSynchronizedSampler,
    WholeStream,
)
from asr.data.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SamplerConfig:
    """Keys of `asr/configs/data/*.yaml` `sampler:`.

    - `max_duration`: target seconds of audio per mini-batch, counted with padding
      (cuts x longest cut). It is soft: lhotse closes a batch once a cut has crossed it,
      so leave headroom when it is tuned to memory. Ignored with `bucket_batch_size`.
    - `num_buckets`: duration buckets, estimated from the data unless
      `bucket_duration_bins` is given.
    - `bucket_duration_bins`: upper edges of the buckets, inclusive: seconds `[d, ...]`
      (1D) or `[[seconds, tokens], ...]` (2D). Cuts beyond the last edge are dropped
      (counted).
    - `bins_file`: a YAML file written by `asr-estimate-bins` or `asr-oomptimizer`. It
      replaces `bucket_duration_bins` and `bucket_batch_size` (null where it has none,
      e.g. a preset's shipped batches, `batches=...`) and a per-bucket `max_tps`; a single
      `max_tps` here stays unless the file has its own.
    - `bucket_batch_size`: a fixed batch size per bucket (same length as the bins).
    - `max_tps`: tokens per second above which a cut is dropped (counted); one number or
      one per bucket.
    - `min_tps`: tokens per second below which a cut is dropped (counted).
    - `min_cut_duration`: shorter utterances are not sampled (seconds).
    - `max_cut_duration`: longer utterances are not sampled (seconds).
    - `sync_buckets`: every data-parallel rank draws from the same bucket at each step
      (`asr.data.rank_sync`; false only to measure what that saves).
    - `shuffle`: shuffle the cuts (within the buffer) and the buckets' batches.
    - `drop_last`: drop the last, incomplete batches of an epoch.
    - `buffer_size`: cuts each rank holds in memory to fill its buckets (it reads up to half
      as many again where no bucket is full on every rank).
    - `quadratic_duration`: seconds at which attention's quadratic cost doubles an
      utterance's weight (null: linear), keeping long-utterance batches in memory.
    - `seed`: of the shuffling (the same on every rank).
    """

    max_duration: float | None = 600.0
    num_buckets: int = 30
    bucket_duration_bins: tuple[Bin, ...] | None = None
    bins_file: str | None = None
    bucket_batch_size: tuple[int, ...] | None = None
    max_tps: float | tuple[float, ...] | None = None
    min_tps: float | None = None
    min_cut_duration: float = 0.5
    max_cut_duration: float = 30.0
    sync_buckets: bool = True
    shuffle: bool = True
    drop_last: bool = False
    buffer_size: int = 20_000
    quadratic_duration: float | None = None
    seed: int = 0

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any]) -> SamplerConfig:
        """Build from a config mapping; an unknown key is an error that names it. A
        `bins_file` replaces the buckets (see the class docstring)."""
        values = checked_keys(cls, cfg, "data.sampler")
        if values.get("bins_file"):
            from_file = read_bins(values["bins_file"])
            values["bucket_duration_bins"] = from_file.get("bucket_duration_bins")
            values["bucket_batch_size"] = from_file.get("bucket_batch_size")
            per_bucket = isinstance(values.get("max_tps"), Sequence)
            if from_file.get("max_tps") is not None or per_bucket:
                values["max_tps"] = from_file.get("max_tps")
        if values.get("bucket_duration_bins") is not None:
            values["bucket_duration_bins"] = tuple(_bin(b) for b in values["bucket_duration_bins"])
        if values.get("bucket_batch_size") is not None:
            values["bucket_batch_size"] = tuple(int(b) for b in values["bucket_batch_size"])
        if isinstance(values.get("max_tps"), Sequence):
            values["max_tps"] = tuple(float(x) for x in values["max_tps"])
        return cls(**values)

    def uses_tokens(self) -> bool:
        """Whether batching counts tokens: 2D bins or a tokens-per-second limit."""
        bins = self.bucket_duration_bins
        two_d = bool(bins) and isinstance(bins[0], tuple)
        return two_d or self.max_tps is not None or self.min_tps is not None


def _bin(edge: Any) -> Bin:
    if isinstance(edge, Sequence) and not isinstance(edge, str):
        if len(edge) != 2:
            raise ValueError(f"a 2D bin is [seconds, tokens], got {list(edge)}")
        return float(edge[0]), int(edge[1])
    return float(edge)


def num_tokens(cut: Cut) -> int:
    """Token count stored on the cut by `count_tokens` (or by whoever made the cut)."""
    try:
        return cut.custom["num_tokens"]
    except (KeyError, TypeError):
        raise KeyError(
            f"cut {cut.id} has no custom num_tokens: 2D buckets and TPS limits need "
            "build_sampler(..., tokenizer=...)"
        ) from None


def cut_lengths(cuts: Iterable[Cut]) -> CutLengths:
    """Durations and stored token counts (`num_tokens`) of `cuts`, for `asr.data.bins`."""
    cuts = list(cuts)
    return CutLengths(
        [c.id for c in cuts],
        np.asarray([c.duration for c in cuts], dtype=float),
        np.asarray([num_tokens(c) for c in cuts], dtype=np.int64),
    )


def padding_stats(batches: Iterable[Iterable[Cut]]) -> dict[str, float]:
    """What padding costs over `batches` (each a batch's cuts, with `num_tokens`): the share
    of padding in the padded input frames (`frame_padding`: 1 - real / padded), in the
    padded tokens (`token_padding`) and in a transducer's padded T x (U + 1) lattice nodes
    (`lattice_padding`: what a batched loss computes for nothing); `seconds_per_batch` (real
    audio, mean) and `batches`. Frames are taken as proportional to seconds."""
    real = {"frames": 0.0, "tokens": 0.0, "nodes": 0.0}
    padded = dict.fromkeys(real, 0.0)
    count = 0
    for batch in batches:
        durations = np.asarray([c.duration for c in batch], dtype=float)
        tokens = np.asarray([num_tokens(c) for c in batch], dtype=float)
        real["frames"] += durations.sum()
        real["tokens"] += tokens.sum()
        real["nodes"] += (durations * (tokens + 1)).sum()
        padded["frames"] += len(durations) * durations.max()
        padded["tokens"] += len(tokens) * tokens.max()
        padded["nodes"] += len(durations) * durations.max() * (tokens.max() + 1)
        count += 1
    if not count:
        raise ValueError("padding_stats needs at least one batch")
    return {
        "frame_padding": float(1 - real["frames"] / padded["frames"]),
        "token_padding": float(1 - real["tokens"] / padded["tokens"]),
        "lattice_padding": float(1 - real["nodes"] / padded["nodes"]),
        "seconds_per_batch": float(real["frames"] / count),
        "batches": count,
    }


def count_tokens(cuts: CutSet, tokenizer: Tokenizer) -> CutSet:
    """Lazily store each cut's token count in `cut.custom["num_tokens"]`."""

    def annotate(cut: Cut) -> Cut:
        cut.num_tokens = len(tokenizer.encode(cut_text(cut)))
        return cut

    return cuts.map(annotate)


@dataclass
class BucketConstraint(SamplingConstraint):
    """Which bucket a cut falls in (`asr.data.bins.bin_index`) and when a batch is full:
    `batch_sizes[bucket]` cuts, or else lhotse's `TimeConstraint` (padded seconds,
    optionally quadratic). A batch of cuts from several buckets (adjacent ones, at the end of
    an epoch) is padded to its longest cut and its most tokens: it takes the batch size of
    the bucket that holds that worst case (the searched sizes are for a bucket's worst case)."""

    bins: list[Bin]
    batch_sizes: list[int] | None = None
    time: TimeConstraint | None = None
    current_bucket: int | None = None
    num_cuts: int = 0
    longest: float = 0.0
    most_tokens: int = 0

    def __post_init__(self) -> None:
        if (self.batch_sizes is None) == (self.time is None):
            raise ValueError("BucketConstraint needs exactly one of batch_sizes and time")
        self.two_d = isinstance(self.bins[0], tuple)

    def is_active(self) -> bool:
        return True

    def measure_length(self, example: Cut) -> float:
        return example.duration

    def select_bucket(self, buckets: Any, example: Cut = None, example_len: Any = None) -> int:
        tokens = num_tokens(example) if self.two_d else None
        return bin_index(self.bins, example.duration, tokens)

    def add(self, example: Cut) -> None:
        if self.time is not None:
            self.time.add(example)
        else:
            self.longest = max(self.longest, example.duration)
            if self.two_d:
                self.most_tokens = max(self.most_tokens, num_tokens(example))
            worst = bin_index(self.bins, self.longest, self.most_tokens if self.two_d else None)
            if worst == len(self.bins):  # no bucket holds both: the smallest size of all
                worst = min(range(len(self.bins)), key=self.batch_sizes.__getitem__)
            self.current_bucket = worst
        self.num_cuts += 1

    def exceeded(self) -> bool:
        if self.time is not None:
            return self.time.exceeded()
        return self.num_cuts > self.batch_sizes[self.current_bucket]

    def close_to_exceeding(self) -> bool:
        if self.time is not None:
            return self.time.close_to_exceeding()
        return self.num_cuts >= self.batch_sizes[self.current_bucket]

    def reset(self) -> None:
        if self.time is not None:
            self.time.reset()
        self.current_bucket, self.num_cuts, self.longest, self.most_tokens = None, 0, 0.0, 0

    def copy(self) -> BucketConstraint:
        return copy.deepcopy(self)


@dataclass
class CutFilter:
    """The sampler's admission check; counts each dropped cut once per reason.

    `max_tps` is one limit or one per bin (chosen by the cut's duration); cuts need
    `num_tokens` (see `count_tokens`) when TPS limits or 2D bins are set."""

    min_duration: float
    max_duration: float
    bins: list[Bin] | None = None
    max_tps: float | Sequence[float] | None = None
    min_tps: float | None = None
    dropped: dict[str, set[str]] = field(default_factory=dict)

    def reason(self, cut: Cut) -> str | None:
        """Why `cut` is not sampled, or None."""
        duration = cut.duration
        if duration < self.min_duration:
            return "shorter than min_cut_duration"
        if duration > self.max_duration:
            return "longer than max_cut_duration"
        two_d = bool(self.bins) and isinstance(self.bins[0], tuple)
        uses_tps = self.max_tps is not None or self.min_tps is not None
        tokens = num_tokens(cut) if two_d or uses_tps else None
        if uses_tps:  # before the bins: an outlier's tokens may fit no 2D bin either
            limit = self.max_tps
            if isinstance(limit, Sequence):  # per bin; none beyond the last bin
                index = duration_index(self.bins, duration)
                limit = limit[index] if index < len(limit) else None
            if limit is not None and tokens / duration > limit:
                return "tokens per second above max_tps"
            if self.min_tps is not None and tokens / duration < self.min_tps:
                return "tokens per second below min_tps"
        if self.bins and bin_index(self.bins, duration, tokens) == len(self.bins):
            return "beyond the last bucket"
        return None

    def __call__(self, cut: Cut) -> bool:
        reason = self.reason(cut)
        if reason is not None:
            self.dropped.setdefault(reason, set()).add(cut.id)
        return reason is None

    def counts(self) -> dict[str, int]:
        """Reason -> distinct cuts dropped so far."""
        return {reason: len(ids) for reason, ids in sorted(self.dropped.items())}


def _check_bins(cfg: SamplerConfig) -> list[Bin] | None:
    bins = list(cfg.bucket_duration_bins) if cfg.bucket_duration_bins is not None else None
    if bins is None:
        if cfg.bucket_batch_size is not None:
            raise ValueError("data.sampler.bucket_batch_size needs bucket_duration_bins")
        return None
    if not bins or bins != sorted(bins):
        raise ValueError(f"data.sampler.bucket_duration_bins must be increasing, got {bins}")
    if len({type(b) for b in bins}) > 1:
        raise ValueError("data.sampler.bucket_duration_bins mixes 1D and 2D bins")
    for name in ("bucket_batch_size", "max_tps"):
        value = getattr(cfg, name)
        if isinstance(value, tuple) and len(value) != len(bins):
            raise ValueError(
                f"data.sampler.{name} has {len(value)} entries but bucket_duration_bins has "
                f"{len(bins)}: give one per bucket"
            )
    if cfg.bucket_batch_size is not None and min(cfg.bucket_batch_size) < 1:
        raise ValueError(f"data.sampler.bucket_batch_size must be >= 1: {cfg.bucket_batch_size}")
    return bins


BINS_ESTIMATE_CUTS = 10_000  # cuts read to estimate 1D bins when none are given (lhotse's)


def estimated_bins(
    cuts: Iterable[Cut], cfg: SamplerConfig, augmenter: CutAugmenter | None = None
) -> tuple[float, ...]:
    """`cfg.num_buckets` duration bins of about equal total duration from the first
    `BINS_ESTIMATE_CUTS` of `cuts` (metadata only), each cut at every one of `augmenter`'s
    speed factors; the last edge is at least `max_cut_duration`, so that only the filter
    decides which cuts are too long."""
    speed = augmenter.config.speed if augmenter is not None else None
    speeds = speed.factors if speed is not None else (1.0,)
    durations = [
        cut.duration if factor == 1.0 else cut.perturb_speed(factor).duration
        for cut in itertools.islice(cuts, BINS_ESTIMATE_CUTS)
        for factor in speeds
    ]
    if not durations:
        raise ValueError("no cuts to estimate the duration bins from: the training data is empty")
    edges = equal_total_edges(durations, min(cfg.num_buckets, len(durations)))
    edges[-1] = float(max(edges[-1], cfg.max_cut_duration))
    log.info("duration bins estimated from %d cuts: %s", len(durations), edges)
    return tuple(edges)


def build_sampler(
    cuts: CutSet | RankPart,
    cfg: Mapping[str, Any] | SamplerConfig,
    *,
    rank: int = 0,
    world_size: int = 1,
    tokenizer: Tokenizer | None = None,
    augmenter: CutAugmenter | None = None,
) -> RankSynchronizedSampler:
    """This rank's bucketed mini-batches (CutSets), in step with the other ranks'
    (`asr.data.rank_sync`): `set_epoch`, `resume_from(position)`, `count_steps()`.

    `cuts`: a cut stream (opened lazily, `asr.data.corpus.open_cuts`), which every rank
    parses and of which it keeps its slice (`ManifestSlice`: each bucket's cuts dealt out in
    turn), or this rank's own part (`RankPart`, e.g. its Shar shards).
    `tokenizer` is needed for 2D bins and TPS limits unless the cuts carry `num_tokens`.
    Dropped cuts are counted in `sampler.cut_filter.counts()`. `augmenter` changes each cut
    for the epoch before it is bucketed, so that buckets, budgets and filters see a
    sped-up cut's own duration (`asr.data.augment`). Without bins, 1D bins are estimated
    from the start of `cuts` (a stream, the same on every rank).
    """
    if not isinstance(cfg, SamplerConfig):
        cfg = SamplerConfig.from_mapping(cfg)
    if cfg.bucket_duration_bins is None and cfg.bucket_batch_size is None:
        if not isinstance(cuts, CutSet):
            raise ValueError("a rank's own part needs bucket_duration_bins (estimated_bins)")
        cfg = replace(cfg, bucket_duration_bins=estimated_bins(cuts, cfg, augmenter))
    bins = _check_bins(cfg)
    fixed = cfg.bucket_batch_size is not None
    if not fixed:
        if cfg.max_duration is None or cfg.max_duration <= 0:
            raise ValueError(
                f"data.sampler.max_duration must be positive (or give bucket_batch_size), "
                f"got {cfg.max_duration}"
            )
        if cfg.max_cut_duration > cfg.max_duration:
            raise ValueError(
                f"data.sampler.max_cut_duration ({cfg.max_cut_duration}) exceeds max_duration "
                f"({cfg.max_duration}): such utterances could never form a batch"
            )
    if cfg.buffer_size < 1:
        raise ValueError(f"data.sampler.buffer_size must be >= 1, got {cfg.buffer_size}")
    batch_sizes = list(cfg.bucket_batch_size) if fixed else None
    selector = BucketConstraint(
        bins, batch_sizes=batch_sizes, time=None if fixed else TimeConstraint()
    )

    def new_batch() -> BucketConstraint:
        """An empty batch: the batch size of the bucket of its worst case, or
        `max_duration` padded seconds."""
        if fixed:
            return BucketConstraint(bins, batch_sizes=batch_sizes)
        time = TimeConstraint(
            max_duration=cfg.max_duration, quadratic_duration=cfg.quadratic_duration
        )
        return BucketConstraint(bins, time=time)

    bucketing = Bucketing(
        num_buckets=len(bins),
        bucket_of=lambda cut: selector.select_bucket(bins, example=cut),
        new_batch=new_batch,
        buffer_size=cfg.buffer_size,
        shuffle=cfg.shuffle,
        drop_last=cfg.drop_last,
        seed=cfg.seed,
        sync=cfg.sync_buckets,
    )
    counted = tokenizer if cfg.uses_tokens() else None  # else the cuts carry num_tokens
    cut_filter = CutFilter(
        cfg.min_cut_duration, cfg.max_cut_duration, bins, cfg.max_tps, cfg.min_tps
    )
    if not isinstance(cuts, CutSet):  # this rank's own part
        part: RankPart = PreparedPart(cuts, counted, augmenter)
    elif world_size == 1:
        part = PreparedPart(WholeStream(cuts), counted, augmenter)
    else:  # the stream every rank parses, dealt out bucket by bucket

        def deal_key(cut: Cut) -> int | None:
            return bucketing.bucket_of(cut) if cut_filter.reason(cut) is None else None

        whole = PreparedPart(WholeStream(cuts), counted, augmenter)
        part = ManifestSlice(whole, deal_key, rank, world_size)
    return RankSynchronizedSampler(
        part,
        bucketing,
        cut_filter=cut_filter,
        rank=rank,
        world_size=world_size,
    )


class PreparedPart:
    """A rank's part with what bucketing reads added: each cut's token count (with a
    tokenizer) and its augmentation for the epoch (only the duration-changing transforms in
    `cut_lists`, which plan batches without the audio)."""

    def __init__(
        self, part: RankPart, tokenizer: Tokenizer | None, augmenter: CutAugmenter | None
    ) -> None:
        self.part, self.tokenizer, self.augmenter = part, tokenizer, augmenter
        self.planning_augmenter = augmenter.durations_only() if augmenter is not None else None

    def cuts(self, epoch: int) -> Iterator[Cut]:
        return self._prepared(self.part.cuts(epoch), epoch, self.augmenter)

    def cut_lists(self, epoch: int) -> Iterator[Cut]:
        return self._prepared(self.part.cut_lists(epoch), epoch, self.planning_augmenter)

    def _prepared(
        self, cuts: Iterable[Cut], epoch: int, augmenter: CutAugmenter | None
    ) -> Iterator[Cut]:
        for cut in cuts:
            if self.tokenizer is not None:
                cut.num_tokens = len(self.tokenizer.encode(cut_text(cut)))
            yield augmenter(cut, epoch) if augmenter is not None else cut


def build_eval_sampler(
    cuts: CutSet, max_duration: float, *, rank: int = 0, world_size: int = 1
) -> EvalSplit:
    """Batches of up to `max_duration` seconds in manifest order, every cut exactly once
    over all ranks, and the same number of batches on each rank (see `EvalSplit`).

    Evaluation needs no bucketing (and lhotse 1.33's bucketing sampler without
    `sync_buckets` can end an epoch early, dropping cuts). lhotse's own rank split repeats
    cuts when a rank would otherwise get none, which would count them twice in the WER.
    """
    if max_duration <= 0:
        raise ValueError(f"evaluation max_duration must be positive, got {max_duration}")
    # world_size=1: lhotse would otherwise split by the environment's WORLD_SIZE/RANK.
    stream = DynamicCutSampler(cuts, max_duration=max_duration, shuffle=False, world_size=1, rank=0)
    return EvalSplit(stream, rank=rank, world_size=world_size)
