"""The mini-batch every model consumes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass
class Batch:
    """A padded mini-batch of utterances.

    Legend: B utterances, T feature frames, F feature bins, U tokens.

    - `features` (B, T, F) float: log-mel filterbank, zero beyond each utterance's length.
    - `feature_lens` (B,) int64: valid frames per utterance.
    - `tokens` (B, U) int64: token ids, padded with `asr.tokens.PAD_ID` (= blank).
    - `token_lens` (B,) int64: valid tokens per utterance.
    - `cut_ids`, `texts`: one per utterance, in batch order.
    - `skipped`: reason -> ids of the cuts the dataset dropped while building this batch
      (unreadable audio, empty or impossible transcript, unknown characters).
    - `first_fault`: the first dropped cut and why, in one line ("" when none was dropped).
    """

    features: torch.Tensor
    feature_lens: torch.Tensor
    tokens: torch.Tensor
    token_lens: torch.Tensor
    cut_ids: list[str]
    texts: list[str]
    skipped: dict[str, list[str]] = field(default_factory=dict)
    first_fault: str = ""

    def __len__(self) -> int:
        return len(self.cut_ids)

    def to(self, device: torch.device | str) -> Batch:
        """A copy with every tensor on `device`."""
        return replace(
            self,
            features=self.features.to(device, non_blocking=True),
            feature_lens=self.feature_lens.to(device, non_blocking=True),
            tokens=self.tokens.to(device, non_blocking=True),
            token_lens=self.token_lens.to(device, non_blocking=True),
        )
