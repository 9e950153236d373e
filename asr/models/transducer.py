"""Transducer parts: Predictor (LSTM or stateless), Joiner, and their composition.

Legend: B batch, T frames, U tokens, V vocabulary, D width. The model owns no loss: see
``asr.losses.transducer``. Decoding states are batch-first (a tensor or a tuple of tensors
with B first), so a decoder can pick per-sample states with ``torch.where``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asr.config_keys import check_choice
from asr.models.acoustic import AcousticModel
from asr.tdt import check_durations

PredictorState = Tensor | tuple[Tensor, ...]
PREDICTOR_KINDS = ("lstm", "stateless")


@dataclass(frozen=True)
class PredictorConfig:
    """The keys of ``model.predictor`` (see `Predictor`).

    - `kind`: `lstm` (an embedding, then an LSTM) or `stateless` (the last `context_size`
      tokens through an embedding and a convolution).
    - `embed_dim`: width of the token embedding.
    - `hidden_dim`: width of the output (the LSTM's hidden state, or the stateless
      predictor's last linear layer).
    - `num_layers`: LSTM layers.
    - `context_size`: `stateless`: the tokens it sees.
    - `dropout`: on the embedding and the output (and between LSTM layers).
    """

    kind: str = "lstm"
    embed_dim: int = 320
    hidden_dim: int = 320
    num_layers: int = 1
    context_size: int = 2
    dropout: float = 0.1

    def __post_init__(self) -> None:
        check_choice("model.predictor.kind", self.kind, PREDICTOR_KINDS)
        if self.kind == "stateless" and self.context_size < 1:
            raise ValueError(f"model.predictor.context_size must be >= 1, got {self.context_size}")


@dataclass(frozen=True)
class JoinerConfig:
    """The keys of ``model.joiner``; the input widths and the vocabulary size follow from
    the other parts.

    - `joint_dim`: width of the joint space the encoder and predictor outputs are projected to.
    - `durations`: null (a plain transducer), or the frames an emission may skip, which
      makes it a token-and-duration transducer (TDT; NeMo's `[0, 1, 2, 3, 4]`): the joiner
      also emits one logit per duration. It must hold 1, no negative and no repeated value.
    """

    joint_dim: int = 320
    durations: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.durations is not None:
            object.__setattr__(
                self, "durations", check_durations(self.durations, "model.joiner.durations")
            )


class Predictor(nn.Module):
    """Label-side network: the tokens emitted so far -> one vector per position.

    ``kind="lstm"``: embedding, LSTM. ``kind="stateless"`` (Ghodsi et al., 2020): the last
    ``context_size`` tokens through an embedding, a depthwise Conv1d over that context,
    ReLU and a linear layer. Both are causal, so padding after a sequence never matters.
    """

    def __init__(self, config: PredictorConfig, *, vocab_size: int, blank_id: int = 0) -> None:
        super().__init__()
        if not 0 <= blank_id < vocab_size:
            raise ValueError(f"blank_id={blank_id} is outside the vocabulary [0, {vocab_size})")
        kind, context_size, dropout = config.kind, config.context_size, config.dropout
        embed_dim, hidden_dim, num_layers = config.embed_dim, config.hidden_dim, config.num_layers
        self.kind, self.vocab_size, self.blank_id = kind, vocab_size, blank_id
        self.context_size = context_size
        self.output_dim = hidden_dim
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.dropout = nn.Dropout(dropout)
        if kind == "lstm":
            self.lstm = nn.LSTM(
                embed_dim,
                hidden_dim,
                num_layers,
                batch_first=True,
                dropout=dropout if num_layers > 1 else 0.0,
            )
        else:
            self.context_conv = nn.Conv1d(
                embed_dim, embed_dim, context_size, groups=embed_dim, bias=False
            )
            self.linear = nn.Linear(embed_dim, hidden_dim)

    def forward(self, tokens: Tensor, token_lens: Tensor) -> Tensor:
        """tokens (B, U), token_lens (B,) -> (B, U+1, D_pred); position u sees tokens < u.

        Position 0 sees only the blank (start) symbol. ``token_lens`` is accepted for the
        common interface: outputs beyond ``token_lens + 1`` are computed but meaningless.
        """
        b = tokens.size(0)
        pad = self.context_size if self.kind == "stateless" else 1
        start = tokens.new_full((b, pad), self.blank_id)
        return self._run(torch.cat([start, tokens], dim=1), state=None)[0]

    def init_state(self, batch_size: int, device: torch.device | str) -> PredictorState:
        """The state before any token: LSTM (h, c) each (B, layers, D), or (B, context-1) ids."""
        if self.kind == "lstm":
            shape = (batch_size, self.lstm.num_layers, self.lstm.hidden_size)
            dtype = self.embedding.weight.dtype
            return (
                torch.zeros(shape, device=device, dtype=dtype),
                torch.zeros(shape, device=device, dtype=dtype),
            )
        return torch.full(
            (batch_size, self.context_size - 1), self.blank_id, device=device, dtype=torch.long
        )

    def step(self, last_tokens: Tensor, state: PredictorState) -> tuple[Tensor, PredictorState]:
        """One decoding step: last_tokens (B,), state -> out (B, D_pred), new state.

        Start with ``init_state`` and ``last_tokens`` = blank to get position 0.
        """
        if self.kind == "lstm":
            out, new_state = self._run(last_tokens[:, None], state)
            return out[:, 0], new_state
        context = torch.cat([state, last_tokens[:, None]], dim=1)  # (B, context_size)
        return self._run(context, None)[0][:, 0], context[:, 1:]

    def _run(self, tokens: Tensor, state: PredictorState | None) -> tuple[Tensor, PredictorState]:
        """LSTM: tokens (B, N) -> (B, N, D). Stateless: (B, N) -> (B, N - context + 1, D)."""
        x = self.dropout(self.embedding(tokens))
        if self.kind == "lstm":
            hc = None if state is None else tuple(s.transpose(0, 1).contiguous() for s in state)
            x, (h, c) = self.lstm(x, hc)
            return self.dropout(x), (h.transpose(0, 1), c.transpose(0, 1))
        x = self.context_conv(x.transpose(1, 2)).transpose(1, 2)
        return self.dropout(self.linear(F.relu(x))), tokens


class Joiner(nn.Module):
    """logits = output(tanh(enc_proj(enc) + pred_proj(pred))), broadcast over (T, U+1).

    The projections act on the un-broadcast inputs, so they run once per frame and once
    per token; only the add, tanh and output layer run T x (U+1) times. With `durations`
    (a token-and-duration transducer) the output layer has V + D outputs: the V token
    logits, then one logit per duration, in the order of `durations` (`split`).
    """

    def __init__(
        self,
        *,
        encoder_dim: int,
        predictor_dim: int,
        joint_dim: int,
        vocab_size: int,
        durations: tuple[int, ...] | None = None,
    ):
        super().__init__()
        self.vocab_size = vocab_size
        self.durations = (
            None if durations is None else check_durations(durations, "model.joiner.durations")
        )
        self.num_durations = 0 if durations is None else len(durations)
        self.enc_proj = nn.Linear(encoder_dim, joint_dim)
        self.pred_proj = nn.Linear(predictor_dim, joint_dim)
        self.output = nn.Linear(joint_dim, vocab_size + self.num_durations)

    def forward(self, enc: Tensor, pred: Tensor) -> Tensor:
        """enc (..., T, 1, D_enc), pred (..., 1, U+1, D_pred) -> logits (..., T, U+1, V)
        (V + D with durations)."""
        return self.joint(self.project_encoder(enc), self.project_predictor(pred))

    def split(self, logits: Tensor) -> tuple[Tensor, Tensor | None]:
        """The joiner's logits (..., V + D) -> (token logits (..., V), duration logits
        (..., D), or None for a plain transducer); views, no copy."""
        if self.durations is None:
            return logits, None
        return logits[..., : self.vocab_size], logits[..., self.vocab_size :]

    def project_encoder(self, x: Tensor) -> Tensor:
        """(..., D_enc) -> (..., D_joint)."""
        return self.enc_proj(x)

    def project_predictor(self, x: Tensor) -> Tensor:
        """(..., D_pred) -> (..., D_joint)."""
        return self.pred_proj(x)

    def joint(self, enc_projected: Tensor, pred_projected: Tensor) -> Tensor:
        """Already projected inputs, broadcastable to each other -> logits (..., V)."""
        return self.output(torch.tanh(enc_projected + pred_projected))

    def tanh_joint_parts(
        self,
    ) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor], nn.Linear] | None:
        """(project_encoder, project_predictor, output) such that logits =
        output(tanh(project_encoder(enc) + project_predictor(pred))): the promise that lets
        the sample-wise loss run this joiner's tanh and output layer by hand (its fused
        path). A subclass that forms its logits otherwise returns None."""
        if type(self).forward is not Joiner.forward or type(self).joint is not Joiner.joint:
            return None
        return self.project_encoder, self.project_predictor, self.output


@dataclass
class TransducerOutput:
    """What a transducer's training loss needs of one batch: the encoder output
    (B, T', D_enc) and its lengths (B,), the predictor output (B, U+1, D_pred), and the CTC
    head's log-probabilities (B, T', V). The last two are None where not asked for (CTC-only
    warm-up steps; no CTC term). No logits: the loss applies the joiner a sample at a time
    (``asr.losses.transducer``), so the B x T' x (U+1) x V tensor never exists."""

    encoder_out: Tensor
    encoder_lens: Tensor
    predictor_out: Tensor | None = None
    ctc_log_probs: Tensor | None = None


class Transducer(AcousticModel):
    """Transducer(encoder, predictor, joiner) with an optional CTC head on the encoder output.

    Training calls ``forward`` (-> ``TransducerOutput``) and passes it, with ``joiner``, to
    a loss of ``asr.losses.transducer``; decoding and export call ``encode`` and then a
    search over ``predictor`` and ``joiner`` (``asr.decoding.transducer``). ``ctc_head``
    maps D_enc -> V.
    """

    def __init__(
        self,
        encoder: nn.Module,
        predictor: nn.Module,
        joiner: nn.Module,
        ctc_head: nn.Module | None = None,
        blank_id: int = 0,
    ) -> None:
        super().__init__()
        vocab_size = joiner.vocab_size
        predictor_vocab = getattr(predictor, "vocab_size", vocab_size)
        if predictor_vocab != vocab_size:
            raise ValueError(
                f"predictor vocab_size={predictor_vocab} != joiner vocab_size={vocab_size}"
            )
        if not 0 <= blank_id < vocab_size:
            raise ValueError(f"blank_id={blank_id} is outside the vocabulary [0, {vocab_size})")
        self.encoder, self.predictor, self.joiner = encoder, predictor, joiner
        self.ctc_head = ctc_head
        self.vocab_size, self.blank_id = vocab_size, blank_id

    @property
    def durations(self) -> tuple[int, ...] | None:
        """The frames an emission may skip (a token-and-duration transducer), or None."""
        return getattr(self.joiner, "durations", None)

    def forward(
        self,
        features: Tensor,
        feature_lens: Tensor,
        tokens: Tensor,
        token_lens: Tensor,
        *,
        predict: bool = True,
        ctc: bool = False,
    ) -> TransducerOutput:
        """features (B, T, F), feature_lens (B,), tokens (B, U) padded, token_lens (B,) ->
        the encoder output, with the predictor output when `predict` and the CTC
        log-probabilities when `ctc`."""
        encoder_out, encoder_lens = self.encode(features, feature_lens)
        log_probs = self.ctc_log_probs(encoder_out) if ctc else None
        predictor_out = self.predictor(tokens, token_lens) if predict else None
        return TransducerOutput(encoder_out, encoder_lens, predictor_out, log_probs)
