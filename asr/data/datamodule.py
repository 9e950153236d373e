"""LightningDataModule: manifests + tokenizer + sampler + dataset -> data loaders.

Resuming a run continues inside the epoch where it stopped: the module's `state_dict()`
(saved in every Lightning checkpoint) records the epoch and how many training batches
Lightning's loop processed; on restore that position (`ResumePosition`) goes to the
training sampler, which replays the same epoch's decisions (they follow from the seed,
the epoch and the data) and skips those batches before any audio is decoded.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import lightning as L
import torch

from asr.config_keys import ConfigError, dataclass_from_keys
from asr.data.augment import AugmentConfig, CutAugmenter
from asr.data.batch import Batch
from asr.data.buckets import SamplerConfig, build_eval_sampler, build_sampler
from asr.data.corpus import open_cuts
from asr.data.dataset import AsrDataset, SpecAugmentConfig
from asr.data.features import FeatureConfig
from asr.data.rank_sync import RankSynchronizedSampler, ResumePosition
from asr.data.shar_sampler import manifest_shards, open_shards, shard_sampler
from asr.data.tokenizer import Tokenizer

log = logging.getLogger(__name__)


class TrainLoader:
    """A DataLoader over the training sampler. Lightning calls `sampler.set_epoch(epoch)`
    on it before each epoch (it looks for a `sampler` attribute). Workers persist across
    epochs."""

    def __init__(self, dataset: AsrDataset, sampler: RankSynchronizedSampler, num_workers: int):
        self.sampler = sampler
        self._loader = _loader(dataset, sampler, num_workers)

    def __iter__(self) -> Iterator[Batch]:
        yield from self._loader
        counts = self.dropped_counts()
        if counts:
            log.info("the sampler dropped (distinct cuts, by reason): %s", counts)

    def dropped_counts(self) -> dict[str, int]:
        """Reason -> distinct cuts the sampler's filter dropped so far (TPS, bins, ...)."""
        return self.sampler.cut_filter.counts()


def _loader(dataset: AsrDataset, sampler: Any, num_workers: int) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(
        dataset,
        sampler=sampler,
        batch_size=None,  # the sampler yields whole mini-batches
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        prefetch_factor=4 if num_workers > 0 else None,
    )


class AsrDataModule(L.LightningDataModule):
    """Training/validation/test loaders for one corpus. The arguments are the keys of the
    `data` group (`asr/configs/data/*.yaml`):

    - `train_cuts`: lhotse cut manifests of the training data (interleaved).
    - `train_shar`: lhotse Shar sources of training data (directories written by
      `asr-export-shar`, or their http(s) URLs): each rank reads its own shards in
      sequence (`asr.data.shar_sampler`); `train_cuts` beside them are read as one shard
      each, split among the ranks by cuts.
    - `valid_cuts`: cut manifests of the validation data.
    - `test_cuts`: cut manifests tested after fitting (may be empty).
    - `tokenizer`: the SentencePiece model (null: audio alone, for pre-training; the
      sampler then bins by duration only).
    - `features`: filterbank settings (`asr.data.features.FeatureConfig`).
    - `spec_augment`: SpecAugment of training batches (`asr.data.dataset.SpecAugmentConfig`;
      null: none).
    - `augment`: speed, volume, reverberation and noise applied to training audio on the
      fly (`asr.data.augment.AugmentConfig`; null: none; needs `features.source=on_the_fly`).
    - `sampler`: the training batches (`asr.data.buckets.SamplerConfig`).
    - `valid_max_duration`: seconds of audio per validation and test batch.
    - `num_workers`: data loader processes (0: load in the training process).
    - `subsampling_factor`: the encoder's; cuts with more tokens than encoder frames are
      dropped.
    """

    def __init__(
        self,
        *,
        train_cuts: Sequence[str],
        valid_cuts: Sequence[str],
        train_shar: Sequence[str] = (),
        test_cuts: Sequence[str] = (),
        tokenizer: str | None = None,
        features: Mapping[str, Any] | None = None,
        spec_augment: Mapping[str, Any] | None = None,
        augment: Mapping[str, Any] | None = None,
        sampler: Mapping[str, Any] | None = None,
        valid_max_duration: float = 600.0,
        num_workers: int = 8,
        subsampling_factor: int = 4,
    ) -> None:
        super().__init__()
        self.train_cuts, self.valid_cuts, self.test_cuts = (
            list(train_cuts),
            list(valid_cuts),
            list(test_cuts),
        )
        self.train_shar = list(train_shar)
        self.tokenizer_path = tokenizer
        self.features = dataclass_from_keys(FeatureConfig, features, "data.features")
        self.spec_augment = (
            dataclass_from_keys(SpecAugmentConfig, spec_augment, "data.spec_augment")
            if spec_augment
            else None
        )
        self.augment = dataclass_from_keys(AugmentConfig, augment, "data.augment")
        if self.augment.is_active() and self.features.source != "on_the_fly":
            raise ConfigError(
                f"data.augment changes the audio, but data.features.source="
                f"{self.features.source} reads stored features: set "
                "data.features.source=on_the_fly (and the manifests of the audio)"
            )
        self.sampler_cfg = SamplerConfig.from_mapping(sampler or {})
        # its noise and impulse responses are loaded and checked now, at start-up
        self.augmenter: CutAugmenter | None = (
            CutAugmenter.from_config(self.augment, self.sampler_cfg.seed)
            if self.augment.is_active()
            else None
        )
        if tokenizer is None and self.sampler_cfg.uses_tokens():
            raise ConfigError(
                "data.tokenizer is null (audio alone, for pre-training), but data.sampler "
                "counts tokens (2D bucket_duration_bins, max_tps or min_tps): bin by "
                "duration alone"
            )
        self.valid_max_duration = valid_max_duration
        self.num_workers = num_workers
        self.subsampling_factor = subsampling_factor
        self._tokenizer: Tokenizer | None = None
        # (rank, world size) -> the training sampler: made once, so that counting the
        # epoch's batches, resuming and training share it (Shar's bins estimated once)
        self._samplers: dict[tuple[int, int], RankSynchronizedSampler] = {}

    @property
    def tokenizer(self) -> Tokenizer | None:
        if self._tokenizer is None and self.tokenizer_path is not None:
            self._tokenizer = Tokenizer.load(self.tokenizer_path)
        return self._tokenizer

    def _rank_and_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _dataset(self, train: bool) -> AsrDataset:
        return AsrDataset(
            self.tokenizer,
            features=self.features,
            spec_augment=self.spec_augment if train else None,
            subsampling_factor=self.subsampling_factor,
        )

    def train_sampler(self, rank: int, world: int) -> RankSynchronizedSampler:
        """Rank `rank`'s training sampler in a run of `world` ranks (made once)."""
        if (rank, world) not in self._samplers:
            self._samplers[rank, world] = self._make_train_sampler(rank, world)
        return self._samplers[rank, world]

    def _make_train_sampler(self, rank: int, world: int) -> RankSynchronizedSampler:
        if not self.train_shar and not self.train_cuts:
            raise ConfigError(
                "data.train_cuts and data.train_shar are both empty: no training data"
            )
        if self.train_shar:
            field = "features" if self.features.source == "precomputed" else "recording"
            shards = open_shards(self.train_shar, [field]) + manifest_shards(self.train_cuts)
            return shard_sampler(
                shards, [field], self.sampler_cfg, rank=rank, world_size=world,
                tokenizer=self.tokenizer, augmenter=self.augmenter,
            )  # fmt: skip
        cuts = open_cuts(self.train_cuts, seed=self.sampler_cfg.seed)
        return build_sampler(
            cuts, self.sampler_cfg, rank=rank, world_size=world, tokenizer=self.tokenizer,
            augmenter=self.augmenter,
        )  # fmt: skip

    def train_dataloader(self) -> TrainLoader:
        sampler = self.train_sampler(*self._rank_and_world())
        return TrainLoader(self._dataset(train=True), sampler, self.num_workers)

    def count_train_batches(self, rank: int = 0, world_size: int = 1) -> int:
        """Mini-batches in one training epoch (of epoch 0; others differ by a few), from the
        cut lists alone: seconds for LibriSpeech's 281k cuts. With several ranks, every
        rank must call it alike (the ranks agree on each step)."""
        return self.train_sampler(rank, world_size).count_steps(0)

    def _eval_loader(self, paths: Sequence[str]) -> torch.utils.data.DataLoader:
        rank, world = self._rank_and_world()
        sampler = build_eval_sampler(
            open_cuts(paths), self.valid_max_duration, rank=rank, world_size=world
        )
        return _loader(self._dataset(train=False), sampler, self.num_workers)

    def val_dataloader(self) -> torch.utils.data.DataLoader:
        return self._eval_loader(self.valid_cuts)

    def test_dataloader(self) -> torch.utils.data.DataLoader:
        if not self.test_cuts:
            raise ValueError("data.test_cuts is empty: nothing to test on")
        return self._eval_loader(self.test_cuts)

    def state_dict(self) -> dict[str, int]:
        """Training position: epoch, batches processed in it, and the number of
        data-parallel processes that split them (saved in checkpoints)."""
        trainer = self.trainer
        if trainer is None:
            return {}
        epochs = trainer.fit_loop.epoch_progress.current
        # `processed` epochs are done; Lightning resumes with the sampler at that epoch. Inside
        # it (its batches not all trained on), the batches done so far are skipped on resume.
        in_epoch = epochs.processed < epochs.ready
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed if in_epoch else 0
        return {"epoch": epochs.processed, "batches_done": done, "world_size": trainer.world_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Hand the position that `state_dict` took to this rank's training sampler: its next
        epoch resumes there. Inside an epoch the position only means something for the
        same number of processes (checked now, not when the first batch is drawn)."""
        if not state:
            return
        position = ResumePosition(
            epoch=state["epoch"],
            steps_done=state["batches_done"],
            world_size=state.get("world_size", 1),
        )
        self.train_sampler(*self._rank_and_world()).resume_from(position)
