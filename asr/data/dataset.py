"""CutSet mini-batch -> `Batch`: audio or stored features, SpecAugment, token ids.

Bad utterances never stop training: an unreadable audio file, an empty transcript, a
character the tokenizer does not know, or a transcript with more tokens than the
encoder will have frames is dropped with a warning naming the cut, and counted in
`Batch.skipped` (the training module logs the running totals).

Only errors about one file count as unreadable audio (see `FILE_ERRORS`). Anything else
is a problem of the whole run (a corpus at the wrong sample rate, a bug, `MemoryError`)
and is raised, so that it stops the run with its own message instead of silently
skipping every cut.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from lhotse import CutSet
from lhotse.audio.utils import AudioLoadingError, DurationMismatchError
from lhotse.cut import Cut, MixedCut
from lhotse.dataset.signal_transforms import SpecAugment

from asr.data.batch import Batch
from asr.data.corpus import cut_text
from asr.data.features import (
    FeatureConfig,
    check_sample_rate,
    compute_features,
    normalize_features,
    to_mono,
)
from asr.data.tokenizer import Tokenizer
from asr.errors import first_line
from asr.frames import subsampled_lengths
from asr.tokens import PAD_ID, UNK_ID

log = logging.getLogger(__name__)

# Why the dataset drops a cut: the keys of `Batch.skipped`, in a fixed order (the training
# module sums the counts over data-parallel ranks as one vector).
UNREADABLE = "unreadable audio"
EMPTY_TRANSCRIPT = "empty transcript"
UNKNOWN_CHARACTER = "character outside the tokenizer"
TOO_MANY_TOKENS = "more tokens than encoder frames"
SKIP_REASONS = (UNREADABLE, EMPTY_TRANSCRIPT, UNKNOWN_CHARACTER, TOO_MANY_TOKENS)

# cut.custom key set by a source that could not read a cut's data (a damaged Shar shard):
# its value says why; the cut is skipped as unreadable.
UNREADABLE_MARK = "unreadable_source"
SOURCE_SHARD = "shar_shard"  # cut.custom key: the Shar shard files a cut's data came from

# Errors that are about one cut's file: a missing, truncated or corrupt audio file
# (lhotse wraps every decoder's failure in AudioLoadingError), audio shorter than its
# manifest says, or stored features that do not decompress (lilcom raises ValueError).
FILE_ERRORS: tuple[type[BaseException], ...] = (
    AudioLoadingError,
    DurationMismatchError,
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    EOFError,
)
FEATURE_FILE_ERRORS = (*FILE_ERRORS, ValueError)


@dataclass(frozen=True)
class SpecAugmentConfig:
    """SpecAugment settings (keys of the `data.spec_augment` config; lhotse's `SpecAugment`).

    - `num_feature_masks`: frequency masks per utterance.
    - `features_mask_size`: the widest frequency mask (bins).
    - `num_frame_masks`: time masks per utterance.
    - `frames_mask_size`: the widest time mask (frames).
    - `max_frames_mask_fraction`: a time mask covers at most this fraction of the
      utterance.
    - `time_warp_factor`: time warping's largest shift in frames (null: no warping).
    - `p`: the probability that an utterance is augmented.
    """

    num_feature_masks: int = 2
    features_mask_size: int = 27
    num_frame_masks: int = 10
    frames_mask_size: int = 40
    max_frames_mask_fraction: float = 0.15
    time_warp_factor: int | None = None
    p: float = 0.9


class AsrDataset(torch.utils.data.Dataset):
    """Map a lhotse CutSet (one sampler mini-batch) to a padded `Batch`.

    Args:
        tokenizer: maps transcripts to token ids; None for audio alone (pre-training): the
            transcripts, if any, are kept as text and neither checked nor tokenized.
        features: where features come from and how they are normalized.
        spec_augment: applied per utterance when given (training only).
        subsampling_factor: the encoder's; cuts with more tokens than encoder frames are dropped.
    """

    def __init__(
        self,
        tokenizer: Tokenizer | None,
        features: FeatureConfig = FeatureConfig(),
        spec_augment: SpecAugmentConfig | None = None,
        subsampling_factor: int = 4,
    ) -> None:
        self.tokenizer = tokenizer
        self.features = features
        self.subsampling_factor = subsampling_factor
        self._extractor = features.extractor()
        self._warned: set[str] = set()
        self._first_fault = ""  # of the batch being built
        self._spec_augment = None
        if spec_augment is not None:
            cfg = spec_augment
            self._spec_augment = SpecAugment(
                time_warp_factor=cfg.time_warp_factor,
                num_feature_masks=cfg.num_feature_masks,
                features_mask_size=cfg.features_mask_size,
                num_frame_masks=cfg.num_frame_masks,
                frames_mask_size=cfg.frames_mask_size,
                max_frames_mask_fraction=cfg.max_frames_mask_fraction,
                p=cfg.p,
            )

    def load_features(self, cut: Cut) -> np.ndarray | str:
        """(T, F) features of `cut`, or why its file cannot be read. Errors that are not
        about this one file propagate."""
        if self.features.source == "precomputed" and cut.has_features:
            if cut.features.type != self._extractor.name:
                raise ValueError(
                    f"cut {cut.id} has {cut.features.type!r} features but "
                    f"data.features.frontend={self.features.frontend} computes "
                    f"{self._extractor.name!r}: precompute them with asr-compute-features "
                    f"--frontend {self.features.frontend}, or set data.features.source=on_the_fly"
                )
            try:
                feats = cut.load_features()
            except FEATURE_FILE_ERRORS as err:
                return unreadable_detail(err, [cut.features.storage_path])
            return normalize_features(feats, self.features.normalize)
        check_sample_rate(cut.id, cut.sampling_rate)
        try:
            audio = cut.load_audio()
        except FILE_ERRORS as err:
            return unreadable_detail(err, audio_paths(cut))
        return compute_features(to_mono(audio), self.features, self._extractor)

    def _check_text(self, cut: Cut) -> tuple[str, list[int]] | str:
        """(text, token ids), or the reason the cut is unusable."""
        text = cut_text(cut)
        if self.tokenizer is None:  # audio alone: any transcript will do, none too
            return text, []
        if not text:
            return EMPTY_TRANSCRIPT
        ids = self.tokenizer.encode(text)
        if UNK_ID in ids:
            return UNKNOWN_CHARACTER
        return text, ids

    def _skip(self, skipped: dict[str, list[str]], cut: Cut, reason: str, detail: str) -> None:
        skipped.setdefault(reason, []).append(cut.id)
        self._first_fault = self._first_fault or f"cut {cut.id}: {detail or reason}"
        if cut.id not in self._warned:  # once per cut and process, not every epoch
            self._warned.add(cut.id)
            log.warning("skipping cut %s: %s", cut.id, detail or reason)

    def __getitem__(self, cuts: CutSet) -> Batch:
        feats, tokens, texts, ids = [], [], [], []
        skipped: dict[str, list[str]] = {}
        self._first_fault = ""
        for cut in cuts:
            marked = (cut.custom or {}).get(UNREADABLE_MARK)
            if marked:
                self._skip(skipped, cut, UNREADABLE, f"unreadable ({marked})")
                continue
            checked = self._check_text(cut)
            if isinstance(checked, str):
                self._skip(skipped, cut, checked, "")
                continue
            text, token_ids = checked
            feat = self.load_features(cut)
            if isinstance(feat, str):  # a corrupt or missing file: skip it, keep going
                shard = (cut.custom or {}).get(SOURCE_SHARD)
                feat += f"; read from Shar shard {shard}" if shard else ""
                self._skip(skipped, cut, UNREADABLE, f"unreadable ({feat})")
                continue
            frames = int(subsampled_lengths(feat.shape[0], self.subsampling_factor))
            if len(token_ids) > frames:
                detail = (
                    f"{len(token_ids)} tokens but only {frames} encoder frames "
                    f"({cut.duration:.2f} s at subsampling x{self.subsampling_factor})"
                )
                self._skip(skipped, cut, TOO_MANY_TOKENS, detail)
                continue
            feat_t = torch.from_numpy(feat)
            if self._spec_augment is not None:
                feat_t = self._spec_augment(feat_t.unsqueeze(0))[0]
            feats.append(feat_t)
            tokens.append(torch.tensor(token_ids, dtype=torch.long))
            texts.append(text)
            ids.append(cut.id)
        batch = collate(feats, tokens, ids, texts, skipped, self.features.num_mel_bins)
        batch.first_fault = self._first_fault
        return batch


def audio_paths(cut: Cut) -> list[str]:
    """The files `cut`'s audio is read from (none for audio held in memory or a URL); for
    a cut mixed with noise (`asr.data.augment`), its tracks' files."""
    if isinstance(cut, MixedCut):
        return [path for track in cut.tracks for path in audio_paths(track.cut)]
    recording = getattr(cut, "recording", None)
    sources = recording.sources if recording is not None else []
    return [source.source for source in sources if source.type == "file"]


def unreadable_detail(err: BaseException, paths: list[str]) -> str:
    """Why a cut's file could not be read: `err` in one line, and for each relative path
    among `paths` that does not exist, the directory it was resolved against (lhotse reads
    relative paths from the working directory of the process)."""
    detail = first_line(err).removesuffix(" Details:")  # lhotse's, before the next lines
    for path in paths:
        if path and not Path(path).is_absolute() and not Path(path).exists():
            named = "" if path in detail else f"{path}: "
            detail += f"; {named}a relative path, read from the working directory {os.getcwd()}"
    return detail


def collate(
    feats: list[torch.Tensor],
    tokens: list[torch.Tensor],
    cut_ids: list[str],
    texts: list[str],
    skipped: dict[str, list[str]],
    num_mel_bins: int,
) -> Batch:
    """Pad per-utterance (T_i, F) features and (U_i,) token ids into a `Batch`."""
    feature_lens = torch.tensor([f.shape[0] for f in feats], dtype=torch.long)
    token_lens = torch.tensor([t.shape[0] for t in tokens], dtype=torch.long)
    if feats:
        features = torch.nn.utils.rnn.pad_sequence(feats, batch_first=True)
        padded_tokens = torch.nn.utils.rnn.pad_sequence(
            tokens, batch_first=True, padding_value=PAD_ID
        )
    else:
        features = torch.zeros(0, 0, num_mel_bins)
        padded_tokens = torch.zeros(0, 0, dtype=torch.long)
    return Batch(features, feature_lens, padded_tokens, token_lens, cut_ids, texts, skipped)
