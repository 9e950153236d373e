"""CutSet mini-batch -> `Batch`: audio or stored features, SpecAugment, token ids.

Bad utterances never stop training: an unreadable audio file, an empty transcript, a
character the tokenizer does not know, or a transcript with more tokens than the
encoder will have frames is dropped with a warning naming the cut, and counted in
`Batch.skipped` (the training module logs the running totals).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch
from lhotse import CutSet
from lhotse.cut import Cut
from lhotse.dataset.signal_transforms import SpecAugment

from asr.data.batch import Batch
from asr.data.features import SAMPLE_RATE, FeatureConfig, compute_features, normalize_features
from asr.data.tokenizer import PAD_ID, UNK_ID, Tokenizer
from asr.models.conformer import subsampled_lengths

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpecAugmentConfig:
    """SpecAugment settings (keys of the `data.spec_augment` config)."""

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
        tokenizer: maps transcripts to token ids.
        features: where features come from and how they are normalized.
        spec_augment: applied per utterance when given (training only).
        subsampling_factor: the encoder's; cuts with more tokens than encoder frames are dropped.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        features: FeatureConfig = FeatureConfig(),
        spec_augment: SpecAugmentConfig | None = None,
        subsampling_factor: int = 4,
    ) -> None:
        self.tokenizer = tokenizer
        self.features = features
        self.subsampling_factor = subsampling_factor
        self._extractor = features.extractor()
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

    def _load(self, cut: Cut) -> np.ndarray:
        if self.features.source == "precomputed" and cut.has_features:
            return normalize_features(cut.load_features(), self.features.normalize)
        audio = cut.load_audio()
        if audio.ndim == 2:
            audio = audio[0]
        if cut.sampling_rate != SAMPLE_RATE:
            raise ValueError(f"expected {SAMPLE_RATE} Hz audio, got {cut.sampling_rate} Hz")
        return compute_features(audio, self.features, self._extractor)

    def _check_text(self, cut: Cut) -> tuple[str, list[int]] | str:
        """(text, token ids), or the reason the cut is unusable."""
        text = " ".join(s.text.strip() for s in cut.supervisions if s.text).strip()
        if not text:
            return "empty transcript"
        ids = self.tokenizer.encode(text)
        if UNK_ID in ids:
            return "character outside the tokenizer"
        return text, ids

    def __getitem__(self, cuts: CutSet) -> Batch:
        feats, tokens, texts, ids, skipped = [], [], [], [], Counter()
        for cut in cuts:
            checked = self._check_text(cut)
            if isinstance(checked, str):
                skipped[checked] += 1
                log.warning("skipping cut %s: %s", cut.id, checked)
                continue
            text, token_ids = checked
            try:
                feat = self._load(cut)
            except Exception as err:  # corrupt/unreadable audio or features: skip, keep going
                skipped["unreadable audio"] += 1
                log.warning("skipping cut %s: unreadable (%s: %s)", cut.id, type(err).__name__, err)
                continue
            frames = int(subsampled_lengths(torch.tensor([feat.shape[0]]), self.subsampling_factor))
            if len(token_ids) > frames:
                skipped["more tokens than encoder frames"] += 1
                log.warning(
                    "skipping cut %s: %d tokens but only %d encoder frames (%.2f s)",
                    cut.id,
                    len(token_ids),
                    frames,
                    cut.duration,
                )
                continue
            feat_t = torch.from_numpy(feat)
            if self._spec_augment is not None:
                feat_t = self._spec_augment(feat_t.unsqueeze(0))[0]
            feats.append(feat_t)
            tokens.append(torch.tensor(token_ids, dtype=torch.long))
            texts.append(text)
            ids.append(cut.id)
        return collate(feats, tokens, ids, texts, dict(skipped), self.features.num_mel_bins)


def collate(
    feats: list[torch.Tensor],
    tokens: list[torch.Tensor],
    cut_ids: list[str],
    texts: list[str],
    skipped: dict[str, int],
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
