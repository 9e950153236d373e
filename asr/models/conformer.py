"""Conformer encoder (Gulati et al., 2020) with relative positional self-attention.

Legend: B batch, T frames, F feature bins, D model width, H heads.
Every sequence travels with its lengths: ``(x, x_lens)`` in, ``(y, y_lens)`` out.
Padded frames never influence valid ones: subsampling and the convolution module zero
them, and attention gives padded keys zero weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asr.config_keys import check_choice
from asr.frames import (
    SUBSAMPLING_KERNEL,
    SUBSAMPLING_PADDING,
    SUBSAMPLING_STRIDE,
    conv_out_lengths,
    num_subsampling_convs,
    subsampled_length,
)
from asr.models.attention import RelPositionMultiHeadAttention, lengths_to_mask, relative_positions

CONV_NORMS = ("batch_norm", "layer_norm")


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

    def forward(self, x: Tensor, x_lens: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, T, F), x_lens (B,) -> y (B, T', D), y_lens (B,) with T' = ceil(T / factor)."""
        lens = x_lens
        x = x.masked_fill(~lengths_to_mask(lens, x.size(1))[:, :, None], 0.0)
        x = x.unsqueeze(1).contiguous(memory_format=self.memory_format)  # (B, 1, T, F)
        for i, conv in enumerate(self.convs):
            x = conv(x)
            lens = conv_out_lengths(lens, 1)
            if i + 1 < len(self.convs):  # padded frames hold ReLU(bias): zero them for the next
                valid = lengths_to_mask(lens, x.size(2))[:, None, :, None]
                x = torch.where(valid, x, 0.0).relu_()  # one pass each way, no mask copies
            else:
                x = F.relu(x)
        x = self.linear(x.transpose(1, 2).flatten(2))  # (B, T', C * F') -> (B, T', D)
        return x, lens


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
    "layer_norm" is per frame and robust to tiny batches.
    """

    def __init__(self, d_model: int, kernel_size: int, dropout: float, conv_norm: str) -> None:
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"conv_kernel_size must be odd to keep T frames, got {kernel_size}")
        check_choice("conv_norm", conv_norm, CONV_NORMS)
        self.norm_in = nn.LayerNorm(d_model)
        self.pointwise_in = nn.Linear(d_model, 2 * d_model)
        self.depthwise = nn.Conv1d(
            d_model, d_model, kernel_size, padding=kernel_size // 2, groups=d_model
        )
        self.batch_norm = conv_norm == "batch_norm"
        self.norm = nn.BatchNorm1d(d_model) if self.batch_norm else nn.LayerNorm(d_model)
        self.pointwise_out = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, T, D), mask (B, T) True on valid frames -> (B, T, D)."""
        x = F.glu(self.pointwise_in(self.norm_in(x)), dim=-1)
        x = x.masked_fill(~mask[:, :, None], 0.0).transpose(1, 2)  # (B, D, T)
        x = self.depthwise(x)
        if self.batch_norm:
            x = masked_batch_norm(x, mask[:, None, :], self.norm).transpose(1, 2)
        else:
            x = self.norm(x.transpose(1, 2))
        return self.dropout(self.pointwise_out(F.silu(x)))


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
    ) -> None:
        super().__init__()
        self.ff1 = FeedForward(d_model, ff_expansion, dropout)
        self.attn_norm = nn.LayerNorm(d_model)
        self.attn = RelPositionMultiHeadAttention(d_model, num_heads, dropout)
        self.attn_dropout = nn.Dropout(dropout)
        self.conv = ConvModule(d_model, conv_kernel_size, dropout, conv_norm)
        self.ff2 = FeedForward(d_model, ff_expansion, dropout)
        self.norm_out = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, pos_emb: Tensor, mask: Tensor) -> Tensor:
        """x (B, T, D), pos_emb (2T-1, D), mask (B, T) -> (B, T, D)."""
        x = x + 0.5 * self.ff1(x)
        x = x + self.attn_dropout(self.attn(self.attn_norm(x), pos_emb, mask))
        x = x + self.conv(x, mask)
        x = x + 0.5 * self.ff2(x)
        return self.norm_out(x)


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

    def __post_init__(self) -> None:
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


@dataclass
class SubsampledFrames:
    """The subsampling's output, padded inside to `pad_frames_to` (B, T'', D), with what the
    layers need: lengths (B,), the valid frames (B, T'') and the relative positions; `count`
    is T' = ceil(T / subsampling_factor), the frames the encoder returns."""

    x: Tensor
    lens: Tensor
    valid: Tensor
    pos_emb: Tensor
    count: int


class ConformerEncoder(nn.Module):
    """Features (B, T, F) -> encoder output (B, T', D) with T' = ceil(T / subsampling_factor).

    Output frames beyond ``encoder_lens`` are zero. Padding the batch to
    ``config.pad_frames_to`` never changes the valid outputs.
    """

    def __init__(self, config: ConformerConfig) -> None:
        super().__init__()
        self.config = config
        self.output_dim = config.d_model
        self.subsampling_factor = config.subsampling_factor
        self.pad_frames_to = config.pad_frames_to
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
            )
            for _ in range(config.num_layers)
        )

    def forward(self, features: Tensor, feature_lens: Tensor) -> tuple[Tensor, Tensor]:
        """features (B, T, F), feature_lens (B,) -> encoder_out (B, T', D), encoder_lens (B,)."""
        frames = self.subsample(features, feature_lens)
        x = self.run_layers(self.dropout(frames.x), frames, 0, len(self.layers))
        return self.output(x, frames), frames.lens

    def subsample(self, features: Tensor, feature_lens: Tensor) -> SubsampledFrames:
        """The convolutional subsampling alone (no dropout): what pre-training masks."""
        frames = subsampled_length(features.size(1), self.subsampling_factor)
        multiple = self.subsampling_factor * self.pad_frames_to
        features = F.pad(features, (0, 0, 0, -features.size(1) % multiple))
        x, lens = self.subsampling(features, feature_lens)
        mask = lengths_to_mask(lens, x.size(1))
        pos_emb = relative_positions(x.size(1), self.output_dim, x.device, x.dtype)
        return SubsampledFrames(x, lens, mask, pos_emb, frames)

    def run_layers(self, x: Tensor, frames: SubsampledFrames, start: int, stop: int) -> Tensor:
        """Layers `start` to `stop - 1` over x (B, T'', D), padded as `frames.x` is."""
        for layer in self.layers[start:stop]:
            x = layer(x, frames.pos_emb, frames.valid)
        return x

    def output(self, x: Tensor, frames: SubsampledFrames) -> Tensor:
        """The first T' = ceil(T / subsampling_factor) frames, zero beyond each length."""
        return x[:, : frames.count].masked_fill(~frames.valid[:, : frames.count, None], 0.0)
