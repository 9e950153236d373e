"""Duration bucketing: the sampler that groups utterances of similar length.

`build_sampler` puts lhotse's `DynamicBucketingSampler` behind the keys of the
`data.sampler` config. With `sync_buckets` every data-parallel rank draws from the same
duration bucket at each step, so no rank waits on a longer batch than the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from lhotse import CutSet
from lhotse.dataset import DynamicBucketingSampler, DynamicCutSampler


@dataclass(frozen=True)
class SamplerConfig:
    """Keys of `configs/data/*.yaml` `sampler:`.

    - `max_duration`: target seconds of audio per mini-batch, counted with padding
      (cuts x longest cut). It is soft: lhotse closes a batch once a cut has crossed it,
      so leave headroom when it is tuned to memory.
    - `num_buckets`: duration buckets, estimated from the data unless
      `bucket_duration_bins` (the num_buckets - 1 upper edges, seconds) is given.
    - `min_cut_duration` / `max_cut_duration`: utterances outside are not sampled.
    - `buffer_size`: cuts held in memory to fill the buckets.
    - `quadratic_duration`: seconds at which attention's quadratic cost doubles an
      utterance's weight (None: linear), keeping long-utterance batches in memory.
    - `sync_buckets`: every data-parallel rank draws from the same duration bucket at each
      step; must stay true (see `build_sampler`).
    """

    max_duration: float = 200.0
    num_buckets: int = 10
    bucket_duration_bins: tuple[float, ...] | None = None
    min_cut_duration: float = 0.3
    max_cut_duration: float = 30.0
    sync_buckets: bool = True
    shuffle: bool = True
    drop_last: bool = False
    buffer_size: int = 10_000
    quadratic_duration: float | None = None
    seed: int = 0

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any]) -> SamplerConfig:
        """Build from a config mapping; an unknown key is an error that names it."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise KeyError(f"unknown data.sampler key(s) {unknown}; valid keys: {sorted(known)}")
        values = dict(cfg)
        if values.get("bucket_duration_bins") is not None:
            values["bucket_duration_bins"] = tuple(float(b) for b in values["bucket_duration_bins"])
        return cls(**values)


def build_sampler(
    cuts: CutSet,
    cfg: Mapping[str, Any] | SamplerConfig,
    *,
    rank: int = 0,
    world_size: int = 1,
) -> DynamicBucketingSampler:
    """A bucketing sampler yielding CutSet mini-batches, with `state_dict()`/`load_state_dict()`.

    `cuts` should be opened lazily (`asr.data.corpus.load_cuts`). `rank`/`world_size` split
    the data across data-parallel processes.
    """
    if not isinstance(cfg, SamplerConfig):
        cfg = SamplerConfig.from_mapping(cfg)
    if cfg.max_duration <= 0:
        raise ValueError(f"data.sampler.max_duration must be positive, got {cfg.max_duration}")
    if cfg.max_cut_duration > cfg.max_duration:
        raise ValueError(
            f"data.sampler.max_cut_duration ({cfg.max_cut_duration}) exceeds max_duration "
            f"({cfg.max_duration}): such utterances could never form a batch"
        )
    if not cfg.sync_buckets:
        # lhotse 1.33 picks among "non-empty" buckets with `if bucket` on a queue.Queue,
        # which is always true, so near the end of an epoch it can pick an empty bucket
        # and stop the epoch early, silently dropping the cuts still buffered.
        raise ValueError(
            "data.sampler.sync_buckets=false is not supported: lhotse 1.33's unsynchronized "
            "bucket selection can end an epoch early and drop cuts; use sync_buckets=true "
            "(identical on one process, synchronized across data-parallel ranks)"
        )
    bins = list(cfg.bucket_duration_bins) if cfg.bucket_duration_bins is not None else None
    if bins is not None and bins != sorted(bins):
        raise ValueError(f"data.sampler.bucket_duration_bins must be increasing, got {bins}")
    sampler = DynamicBucketingSampler(
        cuts,
        max_duration=cfg.max_duration,
        num_buckets=cfg.num_buckets if bins is None else len(bins) + 1,
        duration_bins=bins,
        shuffle=cfg.shuffle,
        drop_last=cfg.drop_last,
        buffer_size=cfg.buffer_size,
        quadratic_duration=cfg.quadratic_duration,
        sync_buckets=cfg.sync_buckets,
        world_size=world_size,
        rank=rank,
        seed=cfg.seed,
    )
    lo, hi = cfg.min_cut_duration, cfg.max_cut_duration
    return sampler.filter(lambda cut: lo <= cut.duration <= hi)


def build_eval_sampler(
    cuts: CutSet, max_duration: float, *, rank: int = 0, world_size: int = 1
) -> DynamicCutSampler:
    """Batches of up to `max_duration` seconds in manifest order, every cut exactly once.

    Evaluation needs no bucketing (and lhotse 1.33's bucketing sampler without
    `sync_buckets` can end an epoch early, dropping cuts).
    """
    if max_duration <= 0:
        raise ValueError(f"evaluation max_duration must be positive, got {max_duration}")
    return DynamicCutSampler(
        cuts, max_duration=max_duration, shuffle=False, rank=rank, world_size=world_size
    )
