"""Conformer encoder (Gulati et al., 2020) with relative positional self-attention.

Legend: B batch, T frames, F feature bins, D model width, H heads.
Every sequence travels with its lengths: ``(x, x_lens)`` in, ``(y, y_lens)`` out.
Padded frames never influence valid ones: subsampling and the convolution module zero
them, and attention gives padded keys zero weight.

Streaming (``model.encoder.streaming``, docs/streaming.md) is a property of this encoder:
attention within a chunk and a bounded left context, a causal depthwise convolution,
subsampling that sees its chunk only, and (``feature_stats``) a global feature
normalization held in the model. Training draws a chunk size per batch; `StreamingState`
carries what a stream needs from one chunk to the next (``step``), so chunk-by-chunk
decoding computes what the whole utterance computes through the same masks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asr.config_keys import ConfigError, check_choice
from asr.frames import (
    SUBSAMPLING_KERNEL,
    SUBSAMPLING_PADDING,
    SUBSAMPLING_STRIDE,
    conv_out_lengths,
    num_subsampling_convs,
    subsampled_length,
    subsampled_lengths,
)
from asr.models.attention import RelPositionMultiHeadAttention, lengths_to_mask, relative_positions
from asr.normalization import causal_running_mean, with_global_stats

CONV_NORMS = ("batch_norm", "layer_norm")
FULL_CONTEXT = -1  # a chunk size or left context: everything
FULL_CONTEXT_MODEL = (
    "this model was trained with full context (model.encoder.streaming is null): it cannot stream"
)


class ConvSubsampling(nn.Module):
    """Stacked stride-2 Conv2d + ReLU over (time, frequency), then a linear map to D.

    ``factor`` 4 uses 2 convolutions, 8 uses 3. Padded frames are zeroed before every
    convolution, so a padded batch gives the same valid outputs as each utterance alone.
    """

    def __init__(
        self, input_dim: int, d_model: int, factor: int = 4, channels: int | None = None
    ) -> None:
        super().__init__()
        self.factor = factor
        num_convs = num_subsampling_convs(factor)
        channels = channels or d_model
        self.convs = nn.ModuleList(
            nn.Conv2d(
                1 if i == 0 else channels,
                channels,
                SUBSAMPLING_KERNEL,
                SUBSAMPLING_STRIDE,
                SUBSAMPLING_PADDING,
            )
            for i in range(num_convs)
        )
        self.linear = nn.Linear(channels * conv_out_lengths(input_dim, num_convs), d_model)
        # Channels-last (B, T, F, C in memory): oneDNN's convolutions on CPUs are faster in
        # this layout, in float32 and more so in bfloat16; GPUs prefer it for bf16 too.
        # `use_memory_format(torch.contiguous_format)` before an ONNX export, whose tracer
        # would otherwise fix the batch size (its channels-last strides depend on it).
        self.use_memory_format(torch.channels_last)

    def use_memory_format(self, memory_format: torch.memory_format) -> None:
        """Keep the convolutions' weights and inputs in `memory_format`."""
        self.memory_format = memory_format
        self.convs.to(memory_format=memory_format)

    def forward(
        self, x: Tensor, x_lens: Tensor, x_starts: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """x (B, T, F), x_lens (B,) -> y (B, T', D), y_lens (B,) with T' = ceil(T / factor).

        `x_starts` (B,), multiples of the factor: frames before them are padding too, as if
        each row began there (a stream's first chunk, whose history is empty)."""
        lens, starts = x_lens, x_starts
        x = x.masked_fill(~_valid_frames(lens, starts, x.size(1))[:, :, None], 0.0)
        x = x.unsqueeze(1).contiguous(memory_format=self.memory_format)  # (B, 1, T, F)
        for i, conv in enumerate(self.convs):
            x = conv(x)
            lens = conv_out_lengths(lens, 1)
            starts = None if starts is None else starts // SUBSAMPLING_STRIDE
            if i + 1 < len(self.convs):  # padded frames hold ReLU(bias): zero them for the next
                valid = _valid_frames(lens, starts, x.size(2))[:, None, :, None]
                x = torch.where(valid, x, 0.0).relu_()  # one pass each way, no mask copies
            else:
                x = F.relu(x)
        x = self.linear(x.transpose(1, 2).flatten(2))  # (B, T', C * F') -> (B, T', D)
        return x, lens


def _valid_frames(lens: Tensor, starts: Tensor | None, length: int) -> Tensor:
    """(B, length) True on frames in [starts, lens) (starts None: 0)."""
    valid = lengths_to_mask(lens, length)
    if starts is None:
        return valid
    return valid & (torch.arange(length, device=lens.device) >= starts[:, None])


class FeedForward(nn.Module):
    """Pre-norm feed-forward: LayerNorm, Linear D -> eD, SiLU, dropout, Linear eD -> D, dropout."""

    def __init__(self, d_model: int, expansion: int, dropout: float) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.LayerNorm(d_model),
            nn.Linear(d_model, expansion * d_model),
            nn.SiLU(),
            nn.Dropout(dropout),
            nn.Linear(expansion * d_model, d_model),
            nn.Dropout(dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) -> (B, T, D)."""
        return self.net(x)


def masked_batch_norm(x: Tensor, mask: Tensor, norm: nn.BatchNorm1d) -> Tensor:
    """``norm`` applied to x (B, D, T) with training statistics over valid frames only.

    mask (B, 1, T) is True on valid frames. In training the batch mean and variance, and
    the running statistics ``norm`` keeps, come from valid frames alone, so the padding
    of a batch (its longest utterance, ``pad_frames_to``) changes neither the valid
    outputs nor the model; in eval mode ``norm`` runs as it is, and so does a
    ``SyncBatchNorm`` (``trainer.sync_batchnorm``: statistics across ranks, padding
    included). Computed in float32 (as autocast runs batch norm); outputs at padded frames
    are not meaningful.
    """
    if isinstance(norm, nn.SyncBatchNorm) or (not norm.training and norm.running_mean is not None):
        return norm(x)
    x = x.float()
    count = mask.sum()
    mean = x.masked_fill(~mask, 0.0).sum((0, 2)) / count
    centered = x - mean[:, None]
    var = centered.masked_fill(~mask, 0.0).square().sum((0, 2)) / count
    if norm.training and norm.track_running_stats:
        with torch.no_grad():
            norm.num_batches_tracked.add_(1)
            momentum = norm.momentum
            if momentum is None:  # cumulative moving average, as nn.BatchNorm1d does
                momentum = 1.0 / float(norm.num_batches_tracked)
            unbiased = var * (count / (count - 1).clamp(min=1))
            norm.running_mean.lerp_(mean.to(norm.running_mean.dtype), momentum)
            norm.running_var.lerp_(unbiased.to(norm.running_var.dtype), momentum)
    scale = torch.rsqrt(var + norm.eps)
    if norm.affine:
        return torch.addcmul(norm.bias[:, None], centered, (scale * norm.weight)[:, None])
    return centered * scale[:, None]


class ConvModule(nn.Module):
    """LayerNorm, pointwise conv + GLU, depthwise conv, norm, SiLU, pointwise conv, dropout.

    Padded frames are zeroed before the depthwise convolution, so they never leak into
    valid frames. ``conv_norm="batch_norm"`` computes its training statistics over valid
    frames only (``masked_batch_norm``), so how a batch is padded changes nothing;
    "layer_norm" is per frame and robust to tiny batches. ``causal``: the depthwise
    convolution sees the K-1 frames before a frame and none after (left padding, or the
    previous chunk's last K-1 inputs, ``state``); both norms are per frame at inference
    (batch norm then uses its running statistics).
    """

    def __init__(
        self, d_model: int, kernel_size: int, dropout: float, conv_norm: str, causal: bool = False
    ) -> None:
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"conv_kernel_size must be odd to keep T frames, got {kernel_size}")
        check_choice("conv_norm", conv_norm, CONV_NORMS)
        self.causal = causal
        self.state_frames = kernel_size - 1 if causal else 0
        self.norm_in = nn.LayerNorm(d_model)
        self.pointwise_in = nn.Linear(d_model, 2 * d_model)
        self.depthwise = nn.Conv1d(
            d_model, d_model, kernel_size, padding=0 if causal else kernel_size // 2, groups=d_model
        )
        self.batch_norm = conv_norm == "batch_norm"
        self.norm = nn.BatchNorm1d(d_model) if self.batch_norm else nn.LayerNorm(d_model)
        self.pointwise_out = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, x: Tensor, mask: Tensor, state: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D), mask (B, T) True on valid frames -> (B, T, D), and for a causal
        module the last K-1 depthwise inputs (B, D, K-1), the ``state`` of the next chunk
        (None: zeros, the start of an utterance)."""
        x = F.glu(self.pointwise_in(self.norm_in(x)), dim=-1)
        x = x.masked_fill(~mask[:, :, None], 0.0).transpose(1, 2)  # (B, D, T)
        tail = None
        if self.causal:
            if state is None:
                state = x.new_zeros(x.size(0), x.size(1), self.state_frames)
            x = torch.cat([state.to(x.dtype), x], dim=2)
            tail = x[:, :, x.size(2) - self.state_frames :]
        x = self.depthwise(x)
        if self.batch_norm:
            x = masked_batch_norm(x, mask[:, None, :], self.norm).transpose(1, 2)
        else:
            x = self.norm(x.transpose(1, 2))
        return self.dropout(self.pointwise_out(F.silu(x))), tail


class ConformerLayer(nn.Module):
    """Macaron block: x + FFN/2, + MHSA, + conv, + FFN/2, then LayerNorm (pre-norm residuals)."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        ff_expansion: int,
        conv_kernel_size: int,
        dropout: float,
        conv_norm: str,
        causal: bool = False,
    ) -> None:
        super().__init__()
        self.ff1 = FeedForward(d_model, ff_expansion, dropout)
        self.attn_norm = nn.LayerNorm(d_model)
        self.attn = RelPositionMultiHeadAttention(d_model, num_heads, dropout)
        self.attn_dropout = nn.Dropout(dropout)
        self.conv = ConvModule(d_model, conv_kernel_size, dropout, conv_norm, causal)
        self.ff2 = FeedForward(d_model, ff_expansion, dropout)
        self.norm_out = nn.LayerNorm(d_model)

    def forward(
        self, x: Tensor, pos_emb: Tensor, mask: Tensor, allowed: Tensor | None = None
    ) -> Tensor:
        """x (B, T, D), pos_emb (2T-1, D), mask (B, T), allowed (T, T) or None -> (B, T, D)."""
        return self.forward_with_context(x, pos_emb, mask, mask, allowed)[0]

    def forward_with_context(
        self,
        x: Tensor,
        pos_emb: Tensor,
        mask: Tensor,
        key_mask: Tensor,
        allowed: Tensor | None = None,
        keys: Tensor | None = None,
        conv_state: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """The layer's one body, which training (`forward`) and streaming both run: the
        layer over x (B, T, D) (whole utterances, or one chunk), whose attention also sees
        ``keys`` (B, C, D), earlier frames' attention inputs (the left context; key_mask
        (B, C+T) marks the valid ones), and whose convolution continues from
        ``conv_state`` -> the output, x's attention inputs (B, T, D) and the convolution's
        next state."""
        x = x + 0.5 * self.ff1(x)
        attn_in = self.attn_norm(x)
        x = x + self.attn_dropout(self.attn(attn_in, pos_emb, key_mask, allowed, keys))
        conv_out, conv_state = self.conv(x, mask, conv_state)
        x = x + conv_out
        x = x + 0.5 * self.ff2(x)
        return self.norm_out(x), attn_in, conv_state


@dataclass(frozen=True)
class StreamingConfig:
    """The keys of ``model.encoder.streaming``: the encoder is causal and trained over
    several latencies (docs/streaming.md). Sizes are encoder frames, after subsampling.

    - `chunk_sizes`: chunk sizes each training batch draws from; -1 is full context (the
      whole utterance at once, no streaming), which keeps the model good offline too.
      Decoding can use any of them.
    - `left_contexts`: how many frames before its chunk a frame's attention sees, drawn
      per batch with the chunk size; the streaming caches hold this many frames.
    - `chunk_weights`: how often each chunk size is drawn, relative weights in the order
      of `chunk_sizes` (null: equally often).
    - `subsampling_cache`: the subsampling of a chunk sees the last input frames of the
      chunk before it (NeMo's pre-encode cache; a stream keeps `subsampling_factor` frames),
      so the whole utterance is subsampled at once in training; false: each chunk is
      subsampled alone, zero-padded at both edges.
    """

    chunk_sizes: tuple[int, ...] = (2, 4, 8, -1)
    left_contexts: tuple[int, ...] = (32, 64)
    chunk_weights: tuple[float, ...] | None = None
    subsampling_cache: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunk_sizes", tuple(int(c) for c in self.chunk_sizes))
        object.__setattr__(self, "left_contexts", tuple(int(c) for c in self.left_contexts))
        if self.chunk_weights is not None:
            weights = tuple(float(w) for w in self.chunk_weights)
            object.__setattr__(self, "chunk_weights", weights)
            if (
                len(weights) != len(self.chunk_sizes)
                or any(w < 0 for w in weights)
                or not any(weights)
            ):
                raise ConfigError(
                    "model.encoder.streaming.chunk_weights must give one weight >= 0 per chunk "
                    f"size {list(self.chunk_sizes)} (not all 0), got {list(weights)}"
                )
        if not self.chunk_sizes or any(c < 1 and c != FULL_CONTEXT for c in self.chunk_sizes):
            raise ConfigError(
                "model.encoder.streaming.chunk_sizes must list positive frame counts "
                f"(or -1 for full context), got {list(self.chunk_sizes)}"
            )
        if not self.left_contexts or any(c < 1 for c in self.left_contexts):
            raise ConfigError(
                "model.encoder.streaming.left_contexts must list positive frame counts, "
                f"got {list(self.left_contexts)}"
            )

    @property
    def streaming_chunk_sizes(self) -> tuple[int, ...]:
        """The trained chunk sizes a stream can be decoded with (full context excluded)."""
        return tuple(c for c in self.chunk_sizes if c != FULL_CONTEXT)


@dataclass(frozen=True)
class ConformerConfig:
    """The keys of ``model.encoder``.

    - `input_dim`: features per input frame F (the filterbank's bins).
    - `d_model`: the model width D.
    - `num_layers`: Conformer layers.
    - `num_heads`: attention heads H (`d_model` must be a multiple).
    - `ff_expansion`: the feed-forward modules' hidden width, in multiples of `d_model`.
    - `conv_kernel_size`: the convolution module's depthwise kernel (odd).
    - `subsampling_factor`: frames in per encoder frame out (4 or 8).
    - `dropout`: dropout rate of every sublayer.
    - `conv_norm`: the convolution module's normalization, `layer_norm` or `batch_norm`.
    - `subsampling_channels`: channels of the subsampling convolutions (null: `d_model`;
      fewer make the full-resolution convolutions much cheaper).
    - `pad_frames_to`: the batch is padded inside so that the subsampled frames are a
      multiple of it; batches of similar length then share tensor shapes, so kernels
      compiled per shape (oneDNN's bfloat16 kernels on CPUs) are reused, and GPUs favour
      multiples of 8.
    - `feature_stats`: a file of global feature means and variances (`asr-feature-stats`);
      when set, the encoder normalizes its input with them, held as buffers so checkpoints
      and exports carry them (read when training starts; the data then stays
      unnormalized, `data.features.normalize: none`). What a stream can compute, unlike
      per-utterance statistics.
    - `running_mean_frames`: 0, or also subtract from each frame the running mean of the
      utterance's frames up to it (after `feature_stats`), as if this many frames of the
      global mean came first: a causal per-utterance normalization a stream can compute.
    - `streaming`: null (full context) or the chunked, causal encoder (`StreamingConfig`).
    """

    input_dim: int = 80
    d_model: int = 256
    num_layers: int = 12
    num_heads: int = 4
    ff_expansion: int = 4
    conv_kernel_size: int = 31
    subsampling_factor: int = 4
    dropout: float = 0.1
    conv_norm: str = "layer_norm"
    subsampling_channels: int | None = None
    pad_frames_to: int = 8
    feature_stats: str | None = None
    running_mean_frames: int = 0
    streaming: StreamingConfig | None = None

    def __post_init__(self) -> None:
        if self.running_mean_frames < 0:
            raise ValueError(
                f"model.encoder.running_mean_frames must be >= 0, got {self.running_mean_frames}"
            )
        if self.pad_frames_to < 1:
            raise ValueError(f"model.encoder.pad_frames_to must be >= 1, got {self.pad_frames_to}")
        if self.d_model % self.num_heads:
            raise ValueError(
                f"model.encoder.d_model={self.d_model} must be divisible by "
                f"num_heads={self.num_heads}"
            )
        if self.conv_kernel_size % 2 == 0:
            raise ValueError(
                "model.encoder.conv_kernel_size must be odd to keep T frames, "
                f"got {self.conv_kernel_size}"
            )
        check_choice("model.encoder.conv_norm", self.conv_norm, CONV_NORMS)
        num_subsampling_convs(self.subsampling_factor)  # names the valid factors
        if isinstance(self.streaming, Mapping):  # a config read back from a checkpoint
            object.__setattr__(self, "streaming", StreamingConfig(**self.streaming))


@dataclass(frozen=True)
class Chunking:
    """How far each frame's attention sees, in encoder frames: its own chunk of `chunk`
    frames (those up to the chunk's end) and `left` frames before the chunk (-1: all).
    `chunk` -1 is full context: the whole utterance at once. An argument of the encoder's
    `forward` and `step`, never state left on it."""

    chunk: int = FULL_CONTEXT
    left: int = FULL_CONTEXT

    @property
    def is_full(self) -> bool:
        return self.chunk == FULL_CONTEXT


FULL = Chunking()


def chunk_attention_mask(length: int, chunking: Chunking, device=None) -> Tensor | None:
    """(T, T) True where query frame i may attend key frame j: j's chunk is not after i's
    and (unless `chunking.left` is -1) j is at most `chunking.left` frames before i's
    chunk; None at full context."""
    if chunking.is_full:
        return None
    frames = torch.arange(length, device=device)
    chunk_start = frames // chunking.chunk * chunking.chunk
    allowed = frames[None, :] < chunk_start[:, None] + chunking.chunk
    if chunking.left == FULL_CONTEXT:
        return allowed
    return allowed & (frames[None, :] >= chunk_start[:, None] - chunking.left)


def check_trained_chunking(streaming: StreamingConfig | None, chunking: Chunking) -> None:
    """A one-line error unless an encoder trained with `streaming` (None: full context only)
    can attend as `chunking` says: full context always, a chunk only at the chunk sizes and
    left contexts it was trained with (listed). The one place that checks it."""
    if chunking.is_full:
        return
    if streaming is None:
        raise ValueError(FULL_CONTEXT_MODEL)
    if chunking.chunk not in streaming.streaming_chunk_sizes:
        raise ValueError(
            f"chunk size {chunking.chunk} frames was not trained; trained chunk sizes: "
            f"{list(streaming.streaming_chunk_sizes)} frames"
        )
    if chunking.left not in streaming.left_contexts:
        raise ValueError(
            f"left context {chunking.left} frames was not trained; trained left contexts: "
            f"{list(streaming.left_contexts)} frames"
        )


@dataclass
class StreamingState:
    """What a batch of streams carries from one chunk to the next (B first, as sherpa-onnx
    stacks them): per layer the last `left` attention inputs (B, L, left, D), right-aligned,
    of which the last `attention_len` (B,) are valid, and the convolution's last K-1
    inputs (B, L, D, K-1); the subsampling's input history (B, P, F), the last P
    normalized feature frames (P = the subsampling factor with ``subsampling_cache``, else
    0), valid where `history_len` (B,) is P; the running sum (B, F) and count (B,) of the
    globally normalized features (``running_mean_frames``). Zeros at the start of a stream."""

    attention: Tensor
    attention_len: Tensor
    conv: Tensor
    history: Tensor
    history_len: Tensor
    feature_sum: Tensor
    feature_count: Tensor

    @property
    def left(self) -> int:
        """The left context these caches hold, in encoder frames."""
        return self.attention.size(2)

    def select(self, index: Tensor) -> StreamingState:
        """The states of the streams at `index` (B',)."""
        return StreamingState(*(getattr(self, f.name)[index] for f in fields(self)))

    @staticmethod
    def cat(states: list[StreamingState]) -> StreamingState:
        """The states of several batches of streams as one batch."""
        return StreamingState(
            *(torch.cat([getattr(s, f.name) for s in states]) for f in fields(StreamingState))
        )


@dataclass
class LayerInputs:
    """What the Conformer layers take: the subsampled frames (B, T'', D), padded inside to
    `pad_frames_to`, their lengths (B,) and valid frames (B, T''), the relative positions,
    the chunked attention mask (T'', T'') or None; `count` is T' = ceil(T /
    subsampling_factor), the frames the encoder returns."""

    x: Tensor
    lens: Tensor
    valid: Tensor
    pos_emb: Tensor
    count: int
    allowed: Tensor | None = None


class ConformerEncoder(nn.Module):
    """Features (B, T, F) -> encoder output (B, T', D) with T' = ceil(T / subsampling_factor).

    Output frames beyond ``encoder_lens`` are zero. Padding the batch to
    ``config.pad_frames_to`` never changes the valid outputs. A streaming encoder
    (``config.streaming``) attends as the `Chunking` it is given says; in training, given
    none, it draws one per batch from its configured mix.
    """

    def __init__(self, config: ConformerConfig) -> None:
        super().__init__()
        self.config = config
        self.output_dim = config.d_model
        self.subsampling_factor = config.subsampling_factor
        self.pad_frames_to = config.pad_frames_to
        self.streaming = config.streaming
        if config.feature_stats is not None:
            self.register_buffer("feature_mean", torch.zeros(config.input_dim))
            self.register_buffer("feature_scale", torch.ones(config.input_dim))
        self.subsampling = ConvSubsampling(
            config.input_dim,
            config.d_model,
            config.subsampling_factor,
            channels=config.subsampling_channels,
        )
        self.dropout = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(
            ConformerLayer(
                config.d_model,
                config.num_heads,
                config.ff_expansion,
                config.conv_kernel_size,
                config.dropout,
                config.conv_norm,
                causal=config.streaming is not None,
            )
            for _ in range(config.num_layers)
        )

    @property
    def normalizes(self) -> bool:
        """Whether the encoder normalizes its input with global statistics."""
        return hasattr(self, "feature_mean")

    def set_feature_stats(self, mean: Tensor, std: Tensor) -> None:
        """Normalize inputs as (x - mean) / std from now on (F,) each."""
        if not self.normalizes:
            raise ValueError("this encoder was built without model.encoder.feature_stats")
        self.feature_mean.copy_(mean)
        self.feature_scale.copy_(1.0 / std.clamp(min=1e-5))

    def forward(
        self, features: Tensor, feature_lens: Tensor, chunking: Chunking | None = None
    ) -> tuple[Tensor, Tensor]:
        """features (B, T, F), feature_lens (B,) -> encoder_out (B, T', D), encoder_lens (B,).
        `chunking`: how far attention sees (a chunk only at a trained size); None: full
        context, but drawn from the configured mix when a streaming encoder trains."""
        inputs = self.layer_inputs(features, feature_lens, self.chunking_of(chunking))
        x = self.run_layers(self.dropout(inputs.x), inputs, 0, len(self.layers))
        return self.output(x, inputs), inputs.lens

    def chunking_of(self, chunking: Chunking | None) -> Chunking:
        """`chunking`, checked against the trained ones; for None, one drawn from the
        configured mix when a streaming encoder trains (torch's generator, so seeded runs
        repeat), else full context."""
        if chunking is not None:
            check_trained_chunking(self.streaming, chunking)
            return chunking
        if self.streaming is None or not self.training:
            return FULL
        chunks, lefts = self.streaming.chunk_sizes, self.streaming.left_contexts
        weights = self.streaming.chunk_weights
        if weights is None:
            chunk = chunks[int(torch.randint(len(chunks), ()))]
        else:
            chunk = chunks[int(torch.multinomial(torch.tensor(weights), 1))]
        left = lefts[int(torch.randint(len(lefts), ()))]
        return Chunking(chunk, left if chunk != FULL_CONTEXT else FULL_CONTEXT)

    def layer_inputs(
        self, features: Tensor, feature_lens: Tensor, chunking: Chunking
    ) -> LayerInputs:
        """What the layers take (no dropout; what pre-training masks): the features
        normalized and subsampled, padded, with their masks and positions. Without the
        subsampling cache each chunk is subsampled on its own, so no frame sees a later
        chunk; with it the whole utterance is, which is what a stream computes: an output
        frame's inputs end at its chunk's last frame (the kernel-3, stride-2 convolutions
        see one frame ahead at each level, factor - 1 frames in all)."""
        frames = subsampled_length(features.size(1), self.subsampling_factor)
        features = self.normalize(features)[0]
        multiple = self.subsampling_factor * self.pad_frames_to
        if chunking.is_full or self.streaming.subsampling_cache:
            features = F.pad(features, (0, 0, 0, -features.size(1) % multiple))
            x, lens = self.subsampling(features, feature_lens)
        else:
            x, lens = self.subsample_chunks(features, feature_lens, chunking.chunk)
            x = F.pad(x, (0, 0, 0, -x.size(1) % self.pad_frames_to))
        mask = lengths_to_mask(lens, x.size(1))
        pos_emb = relative_positions(x.size(1), self.output_dim, x.device, x.dtype)
        allowed = chunk_attention_mask(x.size(1), chunking, x.device)
        return LayerInputs(x, lens, mask, pos_emb, frames, allowed)

    def normalize(
        self,
        features: Tensor,
        feature_lens: Tensor | None = None,
        running_sum: Tensor | None = None,
        running_count: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """The features (B, T, F) as the encoder reads them: with global statistics, if it
        holds them; then, with ``running_mean_frames``, minus each utterance's causal
        running mean, continued from `running_sum` (B, F) and `running_count` (B,) (None:
        the start) -> the normalized features and the running sum and count after them
        (as given when there is no running mean)."""
        if self.normalizes:
            features = with_global_stats(features, self.feature_mean, self.feature_scale)
        if not self.config.running_mean_frames:
            return features, running_sum, running_count
        return causal_running_mean(
            features, self.config.running_mean_frames, feature_lens, running_sum, running_count
        )

    def subsample_chunks(
        self, features: Tensor, feature_lens: Tensor, chunk: int
    ) -> tuple[Tensor, Tensor]:
        """features (B, T, F) -> (B, n * chunk, D), each chunk of `chunk` encoder frames
        subsampled from its own chunk * factor input frames alone."""
        b, _, f = features.shape
        span = chunk * self.subsampling_factor
        features = F.pad(features, (0, 0, 0, -features.size(1) % span))
        n = features.size(1) // span
        starts = torch.arange(n, device=feature_lens.device) * span
        piece_lens = (feature_lens[:, None] - starts).clamp(0, span).flatten()
        x, _ = self.subsampling(features.reshape(b * n, span, f), piece_lens)
        lens = subsampled_lengths(feature_lens, self.subsampling_factor)
        return x.reshape(b, n * chunk, -1), lens

    def run_layers(self, x: Tensor, inputs: LayerInputs, start: int, stop: int) -> Tensor:
        """Layers `start` to `stop - 1` over x (B, T'', D), padded as `inputs.x` is."""
        for layer in self.layers[start:stop]:
            x = layer(x, inputs.pos_emb, inputs.valid, inputs.allowed)
        return x

    def output(self, x: Tensor, inputs: LayerInputs) -> Tensor:
        """The first T' = ceil(T / subsampling_factor) frames, zero beyond each length."""
        return x[:, : inputs.count].masked_fill(~inputs.valid[:, : inputs.count, None], 0.0)

    # Streaming: one chunk at a time.

    @property
    def history_frames(self) -> int:
        """Input frames of the chunk before that a stream keeps for the subsampling."""
        cached = self.streaming is not None and self.streaming.subsampling_cache
        return self.subsampling_factor if cached else 0

    def initial_state(self, batch_size: int, chunking: Chunking, device=None) -> StreamingState:
        """The state before the first chunk of `batch_size` streams encoded as `chunking`
        says (its left context sizes the caches)."""
        self.check_streamable(chunking)
        layers, d = len(self.layers), self.output_dim
        kernel, f = self.config.conv_kernel_size, self.config.input_dim

        def zeros(*shape: int, dtype: torch.dtype = torch.float32) -> Tensor:
            return torch.zeros(batch_size, *shape, device=device, dtype=dtype)

        return StreamingState(
            zeros(layers, chunking.left, d),
            zeros(dtype=torch.long),
            zeros(layers, d, kernel - 1),
            zeros(self.history_frames, f),
            zeros(dtype=torch.long),
            zeros(f),
            zeros(dtype=torch.long),
        )

    def check_streamable(self, chunking: Chunking) -> None:
        """A one-line error unless this encoder streams and `chunking` is one of its
        trained chunk sizes and left contexts."""
        if self.streaming is None:
            raise ValueError(FULL_CONTEXT_MODEL)
        if chunking.is_full:
            raise ValueError(
                "a stream is encoded chunk by chunk: give a trained Chunking(chunk, left), chunk "
                f"sizes {list(self.streaming.streaming_chunk_sizes)}, left contexts "
                f"{list(self.streaming.left_contexts)} (encoder frames)"
            )
        check_trained_chunking(self.streaming, chunking)

    def step(
        self, features: Tensor, feature_lens: Tensor, state: StreamingState, chunking: Chunking
    ) -> tuple[Tensor, Tensor, StreamingState]:
        """One chunk of every stream: features (B, chunk * factor, F) (a stream's last chunk
        may be shorter: feature_lens (B,)) -> encoder_out (B, chunk, D), its lengths and the
        next state. With the same `chunking` this computes what `forward` computes for the
        same frames; `state` comes from `initial_state` with it (or from the last step)."""
        self.check_streamable(chunking)
        if state.left != chunking.left:
            raise ValueError(
                f"the state holds a left context of {state.left} frames, the chunking asks "
                f"for {chunking.left}: start streams with initial_state(batch, chunking)"
            )
        chunk, left = chunking.chunk, chunking.left
        span = chunk * self.subsampling_factor
        features = F.pad(features, (0, 0, 0, span - features.size(1)))
        features, feature_sum, feature_count = self.normalize(
            features, feature_lens, state.feature_sum, state.feature_count
        )
        p = self.history_frames
        if p:  # the history's outputs are dropped; a stream's first chunk has none (padding)
            inputs = torch.cat([state.history.to(features.dtype), features], dim=1)
            starts = p - state.history_len
            x, lens = self.subsampling(inputs, feature_lens + p, starts)
            x, lens = x[:, p // self.subsampling_factor :], lens - p // self.subsampling_factor
            history = inputs[:, inputs.size(1) - p :]
        else:
            x, lens = self.subsampling(features, feature_lens)
            history = state.history
        valid = lengths_to_mask(lens, chunk)
        cached = torch.arange(left, device=x.device) >= left - state.attention_len[:, None]
        key_mask = torch.cat([cached, valid], dim=1)
        pos_emb = relative_positions(chunk, self.output_dim, x.device, x.dtype, left + chunk)
        attention, conv = [], []
        for i, layer in enumerate(self.layers):
            keys = state.attention[:, i].to(x.dtype)
            x, attn_in, conv_state = layer.forward_with_context(
                x, pos_emb, valid, key_mask, None, keys, state.conv[:, i]
            )
            attention.append(torch.cat([keys, attn_in], dim=1)[:, chunk:])
            conv.append(conv_state)
        next_state = StreamingState(
            torch.stack(attention, dim=1),
            (state.attention_len + chunk).clamp(max=left),
            torch.stack(conv, dim=1),
            history,
            torch.full_like(state.history_len, p),
            feature_sum,
            feature_count,
        )
        return x.masked_fill(~valid[:, :, None], 0.0), lens, next_state
