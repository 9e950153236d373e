"""What both model kinds are (`Transducer`, `EncoderDecoder`): an encoder whose frames
`encode` returns, their duration, and an optional CTC head on them. Decoding, export,
streaming and training rely on this contract until they need a kind's own decoder."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from asr.frames import FRAME_SHIFT_SECONDS
from asr.models.conformer import Chunking


class AcousticModel(nn.Module):
    """The base of both model kinds: `encoder` (features -> frames) and `ctc_head`
    (D_enc -> V, or None), which each kind's constructor sets."""

    encoder: nn.Module
    ctc_head: nn.Module | None

    @property
    def frame_seconds(self) -> float:
        """Seconds of audio per encoder output frame."""
        return FRAME_SHIFT_SECONDS * getattr(self.encoder, "subsampling_factor", 1)

    def encode(
        self, features: Tensor, feature_lens: Tensor, chunking: Chunking | None = None
    ) -> tuple[Tensor, Tensor]:
        """features (B, T, F), feature_lens (B,) -> encoder_out (B, T', D_enc), encoder_lens;
        `chunking`: a streaming encoder's chunk and left context (None: full context, or
        drawn per batch in training; `ConformerEncoder.forward`)."""
        return self.encoder(features, feature_lens, chunking)

    def ctc_log_probs(self, encoder_out: Tensor) -> Tensor:
        """encoder_out (B, T, D_enc) -> CTC log-probabilities (B, T, V); an error without a
        head."""
        if self.ctc_head is None:
            raise RuntimeError(
                f"this {type(self).__name__} has no CTC head: build it with ctc_head=True "
                "(config key model.ctc_head) to use a CTC loss"
            )
        return F.log_softmax(self.ctc_head(encoder_out), dim=-1)
