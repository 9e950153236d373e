"""Attention encoder-decoder: a pre-norm Transformer decoder over the Conformer encoder.

Legend: B batch (N rows when decoding: hypotheses), T encoder frames, U tokens,
V vocabulary, D decoder width, H heads, Dh = D / H. The decoder reads BOS + tokens and
predicts tokens + EOS (ids from `asr.data.tokenizer`). Incremental decoding keeps a KV
cache per layer; the cross-attention keys and values are computed once per utterance by
`init_state`. Encoder frames beyond their length never take part in cross-attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asr.config_keys import check_choice
from asr.models.acoustic import AcousticModel
from asr.models.attention import lengths_to_mask, sinusoids
from asr.tokens import BLANK_ID, BOS_ID, EOS_ID, IGNORE_INDEX

POSITIONS = ("sinusoidal", "learned")


def sinusoidal_positions(length: int, dim: int, offset: int = 0, device=None) -> Tensor:
    """Absolute sinusoidal encodings of positions offset .. offset+length-1: (length, dim)."""
    return sinusoids(torch.arange(offset, offset + length, device=device, dtype=torch.float32), dim)


@dataclass
class DecoderState:
    """What incremental decoding carries from step to step, for N rows (hypotheses).

    `cross_k`/`cross_v`: per layer (N, H, T, Dh), computed once from the encoder output;
    `memory_mask`: (N, 1, 1, T), True on valid encoder frames; `self_k`/`self_v`: per
    layer (N, H, L, Dh) for the L tokens fed so far.
    """

    cross_k: list[Tensor]
    cross_v: list[Tensor]
    memory_mask: Tensor
    self_k: list[Tensor]
    self_v: list[Tensor]

    @property
    def length(self) -> int:
        """Tokens fed so far."""
        return self.self_k[0].size(2) if self.self_k else 0

    def select(self, index: Tensor, same_memory: bool = False) -> DecoderState:
        """The state of rows `index` (N',), in that order (beam reordering, dropping rows).
        `same_memory`: every row keeps reading the encoder output it read before (a beam
        reordered within its utterances), so the cross-attention tensors are kept as they are."""

        def pick(tensors: list[Tensor]) -> list[Tensor]:
            return [t.index_select(0, index) for t in tensors]

        if same_memory:
            cross_k, cross_v, mask = self.cross_k, self.cross_v, self.memory_mask
        else:
            cross_k, cross_v = pick(self.cross_k), pick(self.cross_v)
            mask = self.memory_mask.index_select(0, index)
        return DecoderState(cross_k, cross_v, mask, pick(self.self_k), pick(self.self_v))


@dataclass
class StaticDecoderState:
    """Incremental decoding state in tensors allocated once, changed only in place (what a
    CUDA graph of a decoding step needs), for N rows, T encoder frames and L tokens.

    `cross_k`/`cross_v`: per layer (N, H, T, Dh); `memory_mask` (N, 1, 1, T); `self_k`/
    `self_v`: per layer (N, H, L, Dh), slot i holds the keys/values of the i-th token fed;
    `self_mask` (1, 1, 1, L): the slots filled so far; `positions` (L, D): the position
    encoding of each slot; `position` (): tokens fed so far, on the device.
    """

    cross_k: list[Tensor]
    cross_v: list[Tensor]
    memory_mask: Tensor
    self_k: list[Tensor]
    self_v: list[Tensor]
    self_mask: Tensor
    positions: Tensor
    position: Tensor


def _heads(x: Tensor, num_heads: int) -> Tensor:
    """(N, L, D) -> (N, H, L, Dh)."""
    n, length, d = x.shape
    return x.view(n, length, num_heads, d // num_heads).transpose(1, 2)


def _merge(x: Tensor) -> Tensor:
    """(N, H, L, Dh) -> (N, L, D)."""
    n, h, length, dh = x.shape
    return x.transpose(1, 2).reshape(n, length, h * dh)


class DecoderLayer(nn.Module):
    """Pre-norm block: x + SelfAttn(LN x), + CrossAttn(LN x, memory), + FFN(LN x)."""

    def __init__(self, d_model: int, num_heads: int, ff_expansion: int, dropout: float) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(
                f"decoder d_model={d_model} must be divisible by num_heads={num_heads}"
            )
        self.num_heads, self.dropout_p = num_heads, dropout
        self.self_norm = nn.LayerNorm(d_model)
        self.self_qkv = nn.Linear(d_model, 3 * d_model)
        self.self_out = nn.Linear(d_model, d_model)
        self.cross_norm = nn.LayerNorm(d_model)
        self.cross_q = nn.Linear(d_model, d_model)
        self.cross_kv = nn.Linear(d_model, 2 * d_model)
        self.cross_out = nn.Linear(d_model, d_model)
        self.ff_norm = nn.LayerNorm(d_model)
        self.ff_in = nn.Linear(d_model, ff_expansion * d_model)
        self.ff_out = nn.Linear(ff_expansion * d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def cross_keys_values(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """memory (N, T, D) -> keys, values (N, H, T, Dh)."""
        k, v = self.cross_kv(memory).chunk(2, dim=-1)
        return _heads(k, self.num_heads), _heads(v, self.num_heads)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        p = self.dropout_p if self.training else 0.0
        return _merge(F.scaled_dot_product_attention(q, k, v, mask, p, is_causal=causal))

    def _cross_and_ff(self, x: Tensor, k: Tensor, v: Tensor, memory_mask: Tensor) -> Tensor:
        q = _heads(self.cross_q(self.cross_norm(x)), self.num_heads)
        x = x + self.dropout(self.cross_out(self._attend(q, k, v, memory_mask, False)))
        hidden = self.dropout(F.gelu(self.ff_in(self.ff_norm(x))))
        return x + self.dropout(self.ff_out(hidden))

    def forward(self, x: Tensor, memory: Tensor, memory_mask: Tensor) -> Tensor:
        """Teacher forcing: x (B, U, D), memory (B, T, D), memory_mask (B, 1, 1, T) -> (B, U, D).
        Position u attends to positions <= u only."""
        q, k, v = (_heads(t, self.num_heads) for t in self.self_qkv(self.self_norm(x)).chunk(3, -1))
        x = x + self.dropout(self.self_out(self._attend(q, k, v, None, True)))
        return self._cross_and_ff(x, *self.cross_keys_values(memory), memory_mask)

    def step(
        self, x: Tensor, state: DecoderState, index: int
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """One new position per row: x (N, 1, D) -> (N, 1, D) and this layer's grown
        self-attention keys/values (N, H, L+1, Dh)."""
        q, k, v = (_heads(t, self.num_heads) for t in self.self_qkv(self.self_norm(x)).chunk(3, -1))
        if state.self_k:
            k = torch.cat([state.self_k[index], k], dim=2)
            v = torch.cat([state.self_v[index], v], dim=2)
        x = x + self.dropout(self.self_out(self._attend(q, k, v, None, False)))
        x = self._cross_and_ff(x, state.cross_k[index], state.cross_v[index], state.memory_mask)
        return x, (k, v)

    def step_static(self, x: Tensor, state: StaticDecoderState, index: int) -> Tensor:
        """`step` over preallocated caches: x (N, 1, D) -> (N, 1, D); this position's keys
        and values are written into slot `state.position` of layer `index`'s cache."""
        q, k, v = (_heads(t, self.num_heads) for t in self.self_qkv(self.self_norm(x)).chunk(3, -1))
        slot = state.position.view(1)
        state.self_k[index].index_copy_(2, slot, k.to(state.self_k[index].dtype))
        state.self_v[index].index_copy_(2, slot, v.to(state.self_v[index].dtype))
        keys, values = state.self_k[index], state.self_v[index]
        x = x + self.dropout(self.self_out(self._attend(q, keys, values, state.self_mask, False)))
        return self._cross_and_ff(x, state.cross_k[index], state.cross_v[index], state.memory_mask)


@dataclass(frozen=True)
class DecoderConfig:
    """The keys of ``model.decoder``.

    - `d_model`: the decoder's width (a projection maps the encoder output when the widths
      differ).
    - `num_layers`: pre-norm Transformer decoder layers.
    - `num_heads`: attention heads (`d_model` must be a multiple).
    - `ff_expansion`: the feed-forward hidden width, in multiples of `d_model`.
    - `dropout`: dropout rate of every sublayer.
    - `positions`: `sinusoidal` (any length) or `learned` (up to `max_positions` tokens).
    - `max_positions`: the longest token sequence of `learned` positions.
    - `tie_embeddings`: the output layer is the embedding matrix.
    """

    d_model: int = 256
    num_layers: int = 6
    num_heads: int = 4
    ff_expansion: int = 4
    dropout: float = 0.1
    positions: str = "sinusoidal"
    max_positions: int = 1024
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        check_choice("model.decoder.positions", self.positions, POSITIONS)
        if self.num_layers < 1:
            raise ValueError(f"model.decoder.num_layers must be >= 1, got {self.num_layers}")


class TransformerDecoder(nn.Module):
    """Token embedding + positions, pre-norm `DecoderLayer`s, final LayerNorm, output layer.

    `encoder_dim` (filled in by `build_model`) adds a linear projection of the encoder
    output when it differs from `config.d_model`.
    """

    def __init__(
        self, config: DecoderConfig, *, vocab_size: int, encoder_dim: int | None = None
    ) -> None:
        super().__init__()
        d_model, num_heads, dropout = config.d_model, config.num_heads, config.dropout
        positions, max_positions = config.positions, config.max_positions
        self.vocab_size, self.d_model = vocab_size, d_model
        self.positions, self.max_positions = positions, max_positions
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)
        self.embed_scale = math.sqrt(d_model)
        self.position_embedding = (
            nn.Embedding(max_positions, d_model) if positions == "learned" else None
        )
        # The sinusoids of the first max_positions positions, computed once (not saved).
        table = sinusoidal_positions(max_positions, d_model) if positions == "sinusoidal" else None
        self.register_buffer("sinusoids", table, persistent=False)
        encoder_dim = encoder_dim or d_model
        self.memory_proj = nn.Linear(encoder_dim, d_model) if encoder_dim != d_model else None
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, num_heads, config.ff_expansion, dropout)
            for _ in range(config.num_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.output = None if config.tie_embeddings else nn.Linear(d_model, vocab_size, bias=False)
        self.output_bias = nn.Parameter(torch.zeros(vocab_size))

    def _embed(self, tokens: Tensor, offset: int) -> Tensor:
        """tokens (N, L) at positions offset.. -> (N, L, D)."""
        length = tokens.size(1)
        if self.position_embedding is not None:
            if offset + length > self.max_positions:
                raise ValueError(
                    f"decoder position {offset + length - 1} >= max_positions="
                    f"{self.max_positions}: raise model.decoder.max_positions"
                )
            pos = self.position_embedding.weight[offset : offset + length]
        elif offset + length <= self.sinusoids.size(0):
            pos = self.sinusoids[offset : offset + length]
        else:
            pos = sinusoidal_positions(length, self.d_model, offset, tokens.device)
        x = self.embedding(tokens) * self.embed_scale + pos.to(self.embedding.weight.dtype)
        return self.dropout(x)

    def _logits(self, x: Tensor) -> Tensor:
        weight = self.embedding.weight if self.output is None else self.output.weight
        return F.linear(self.norm(x), weight, self.output_bias)

    def _memory(self, memory: Tensor, memory_lens: Tensor) -> tuple[Tensor, Tensor]:
        """Projected memory and its (N, 1, 1, T) mask, True on valid frames."""
        if self.memory_proj is not None:
            memory = self.memory_proj(memory)
        mask = lengths_to_mask(memory_lens.to(memory.device), memory.size(1))
        return memory, mask[:, None, None, :]

    def forward(self, tokens: Tensor, memory: Tensor, memory_lens: Tensor) -> Tensor:
        """Teacher forcing: tokens (B, U) (BOS first), memory (B, T, D_enc), memory_lens (B,)
        -> logits (B, U, V); position u sees tokens[:, :u+1] only."""
        memory, mask = self._memory(memory, memory_lens)
        x = self._embed(tokens, 0)
        for layer in self.layers:
            x = layer(x, memory, mask)
        return self._logits(x)

    def init_state(self, memory: Tensor, memory_lens: Tensor) -> DecoderState:
        """The state before any token: cross-attention keys/values of every layer."""
        memory, mask = self._memory(memory, memory_lens)
        keys_values = [layer.cross_keys_values(memory) for layer in self.layers]
        return DecoderState(
            cross_k=[k for k, _ in keys_values],
            cross_v=[v for _, v in keys_values],
            memory_mask=mask,
            self_k=[],
            self_v=[],
        )

    def static_state(
        self, rows: int, frames: int, length: int, device: torch.device, dtype: torch.dtype
    ) -> StaticDecoderState:
        """Zeroed caches for `rows` rows, `frames` encoder frames and `length` tokens (fill
        them with `load_static_state`)."""
        if self.position_embedding is not None:
            if length > self.max_positions:
                raise ValueError(
                    f"decoding {length} tokens needs more than max_positions="
                    f"{self.max_positions}: raise model.decoder.max_positions"
                )
            positions = self.position_embedding.weight[:length]
        else:
            positions = sinusoidal_positions(length, self.d_model, 0, device)
        first = self.layers[0]
        heads = first.num_heads
        dh = self.d_model // heads

        def caches(size: int) -> list[Tensor]:
            shape = (rows, heads, size, dh)
            return [torch.zeros(shape, device=device, dtype=dtype) for _ in self.layers]

        return StaticDecoderState(
            cross_k=caches(frames),
            cross_v=caches(frames),
            memory_mask=torch.zeros((rows, 1, 1, frames), dtype=torch.bool, device=device),
            self_k=caches(length),
            self_v=caches(length),
            self_mask=torch.zeros((1, 1, 1, length), dtype=torch.bool, device=device),
            positions=positions.to(device=device, dtype=dtype).clone(),
            position=torch.zeros((), dtype=torch.long, device=device),
        )

    def load_static_state(
        self, state: StaticDecoderState, memory: Tensor, memory_lens: Tensor
    ) -> None:
        """Reset `state` to before the first token for the utterances of memory (n, T', D)
        in its first rows (n, T' within its capacity); other rows see one zero frame."""
        memory, mask = self._memory(memory, memory_lens)
        n, frames = memory.size(0), memory.size(1)
        state.memory_mask.zero_()
        state.memory_mask[n:, ..., 0] = True  # unused rows: no row may attend to nothing
        state.memory_mask[:n, ..., :frames].copy_(mask)
        for i, layer in enumerate(self.layers):
            k, v = layer.cross_keys_values(memory)
            state.cross_k[i].zero_()
            state.cross_v[i].zero_()
            state.cross_k[i][:n, :, :frames].copy_(k)
            state.cross_v[i][:n, :, :frames].copy_(v)
        state.position.zero_()
        state.self_mask.zero_()

    def step_static(self, tokens: Tensor, state: StaticDecoderState) -> Tensor:
        """`step` in place: tokens (N,) -> logits (N, V) for the next token; the caches
        gain this position and `state.position` moves on (no host synchronization)."""
        slots = torch.arange(state.self_mask.size(-1), device=tokens.device)
        torch.le(slots, state.position, out=state.self_mask.view(-1))
        pos = state.positions.index_select(0, state.position.view(1))  # (1, D)
        x = self.dropout(self.embedding(tokens[:, None]) * self.embed_scale + pos)
        for i, layer in enumerate(self.layers):
            x = layer.step_static(x, state, i)
        state.position.add_(1)
        return self._logits(x[:, 0])

    def step(self, tokens: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """Feed one token per row: tokens (N,) -> logits (N, V) for the next token, new state."""
        x = self._embed(tokens[:, None], state.length)
        grown = []
        for i, layer in enumerate(self.layers):
            x, kv = layer.step(x, state, i)
            grown.append(kv)
        new_state = DecoderState(
            state.cross_k,
            state.cross_v,
            state.memory_mask,
            [k for k, _ in grown],
            [v for _, v in grown],
        )
        return self._logits(x[:, 0]), new_state


@dataclass
class AedOutput:
    """What an attention encoder-decoder's training loss needs of one batch: the encoder
    output (B, T', D_enc) and its lengths (B,), the decoder's logits (B, U+1, V) for
    BOS + tokens and their targets tokens + EOS (B, U+1; `IGNORE_INDEX` beyond each
    sequence), and the CTC head's log-probabilities (B, T', V) (None where not asked for)."""

    encoder_out: Tensor
    encoder_lens: Tensor
    logits: Tensor
    targets: Tensor
    ctc_log_probs: Tensor | None = None


class EncoderDecoder(AcousticModel):
    """EncoderDecoder(encoder, decoder) with an optional CTC head on the encoder output.

    Training calls ``forward`` (-> ``AedOutput``); the model owns no loss (see
    `asr.losses.cross_entropy` and `asr.training.objective`). Decoding and export call
    ``encode`` and then a search over the decoder's ``init_state``/``step``
    (``asr.decoding.aed``).
    """

    def __init__(
        self,
        encoder: nn.Module,
        decoder: TransformerDecoder,
        ctc_head: nn.Module | None = None,
        blank_id: int = BLANK_ID,
        bos_id: int = BOS_ID,
        eos_id: int = EOS_ID,
    ) -> None:
        super().__init__()
        self.vocab_size = decoder.vocab_size
        for name, idx in (("blank_id", blank_id), ("bos_id", bos_id), ("eos_id", eos_id)):
            if not 0 <= idx < self.vocab_size:
                raise ValueError(f"{name}={idx} is outside the vocabulary [0, {self.vocab_size})")
        self.encoder, self.decoder, self.ctc_head = encoder, decoder, ctc_head
        self.blank_id, self.bos_id, self.eos_id = blank_id, bos_id, eos_id

    def decoder_io(self, tokens: Tensor, token_lens: Tensor) -> tuple[Tensor, Tensor]:
        """tokens (B, U) padded, token_lens (B,) -> decoder inputs BOS + tokens (B, U+1)
        and targets tokens + EOS (B, U+1), `IGNORE_INDEX` beyond each sequence."""
        b, u = tokens.shape
        lens = token_lens.to(tokens.device)
        valid = torch.arange(u, device=tokens.device) < lens[:, None]
        body = tokens.masked_fill(~valid, self.eos_id)
        inputs = torch.cat([tokens.new_full((b, 1), self.bos_id), body], dim=1)
        targets = torch.cat([body, tokens.new_full((b, 1), self.eos_id)], dim=1)
        beyond = torch.arange(u + 1, device=tokens.device) > lens[:, None]
        return inputs, targets.masked_fill(beyond, IGNORE_INDEX)

    def forward(
        self,
        features: Tensor,
        feature_lens: Tensor,
        tokens: Tensor,
        token_lens: Tensor,
        *,
        ctc: bool = False,
    ) -> AedOutput:
        """features (B, T, F), feature_lens (B,), tokens (B, U) padded, token_lens (B,) ->
        the encoder output and the decoder's logits and targets, with the CTC
        log-probabilities when `ctc`."""
        encoder_out, encoder_lens = self.encode(features, feature_lens)
        inputs, targets = self.decoder_io(tokens, token_lens)
        logits = self.decoder(inputs, encoder_out, encoder_lens)
        log_probs = self.ctc_log_probs(encoder_out) if ctc else None
        return AedOutput(encoder_out, encoder_lens, logits, targets, log_probs)
