"""The two quantizers of self-supervised pre-training: frames -> code ids (and vectors).

- `GumbelQuantizer` (wav2vec 2.0, w2v-BERT): trained. A linear layer gives, per group,
  logits over `num_codes` entries; a Gumbel-softmax sample picks one entry per group in the
  forward pass while the gradient flows through the soft probabilities (straight through).
  The chosen entries' vectors, concatenated over the groups, are the quantized frame. The
  logits, the noise and the softmax are computed in fp32 under any autocast.
- `RandomProjectionQuantizer` (BEST-RQ): frozen. Input frames are stacked by the encoder's
  subsampling factor, normalized without affine parameters, projected by a random matrix
  and matched to the nearest entry of a random, l2-normalized codebook. Projection and
  codebook are buffers drawn from a seed: never trained, the same targets for the same
  input, and saved with the model so that a resumed run keeps them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class TemperatureSchedule:
    """Gumbel-softmax temperature `max(start * decay ** step, end)` (wav2vec 2.0: 2 -> 0.5,
    decay 0.999995 per update)."""

    start: float = 2.0
    end: float = 0.5
    decay: float = 0.999995

    def __post_init__(self) -> None:
        if not 0 < self.end <= self.start or not 0 < self.decay <= 1:
            raise ValueError(
                "the temperature schedule needs 0 < end <= start and 0 < decay <= 1, got "
                f"start={self.start}, end={self.end}, decay={self.decay}"
            )

    def at(self, step: int) -> float:
        return max(self.start * self.decay**step, self.end)


@dataclass
class Quantized:
    """What `GumbelQuantizer` gives: the quantized frames (B, T, code_dim), the chosen code
    ids (B, T, groups) and the softmax probabilities (no noise) averaged over the selected
    frames (groups, num_codes), for the diversity loss and the perplexity."""

    vectors: Tensor
    codes: Tensor
    mean_probs: Tensor


class GumbelQuantizer(nn.Module):
    """Frames (B, T, input_dim) -> `Quantized`: `groups` codebooks of `num_codes` entries
    whose vectors (code_dim / groups each) are concatenated."""

    def __init__(self, input_dim: int, code_dim: int, num_codes: int, groups: int = 2) -> None:
        super().__init__()
        if code_dim % groups:
            raise ValueError(f"code_dim={code_dim} must be a multiple of groups={groups}")
        self.groups, self.num_codes = groups, num_codes
        self.logits = nn.Linear(input_dim, groups * num_codes)
        self.codebook = nn.Parameter(torch.empty(groups, num_codes, code_dim // groups))
        nn.init.uniform_(self.codebook)
        nn.init.normal_(self.logits.weight, std=1.0)  # wav2vec 2.0: N(0, 1), zero bias
        nn.init.zeros_(self.logits.bias)
        self.temperature = TemperatureSchedule().start

    def forward(
        self, x: Tensor, frames: Tensor, generator: torch.Generator | None = None
    ) -> Quantized:
        """x (B, T, input_dim), frames (B, T) bool: the frames whose probabilities count in
        `mean_probs` (the valid ones, or the masked ones). In training the Gumbel noise is
        drawn from `generator` (CPU; a generator on x's device is seeded from it), so that a
        step's noise is the same after a resume; without one, from torch's global RNG."""
        b, t, _ = x.shape
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(x.float(), self.logits.weight.float(), self.logits.bias.float())
            logits = logits.view(b, t, self.groups, self.num_codes)
            probs = logits.softmax(dim=-1)
            if self.training:
                one_hot = gumbel_one_hot(logits, self.temperature, generator)
            else:
                codes = logits.argmax(dim=-1)
                one_hot = F.one_hot(codes, self.num_codes).to(logits.dtype)
            codes = one_hot.argmax(dim=-1)
            vectors = torch.einsum("btgv,gvd->btgd", one_hot, self.codebook.float())
        selected = frames[:, :, None, None].to(probs.dtype)
        mean_probs = (probs * selected).sum(dim=(0, 1)) / selected.sum().clamp(min=1)
        return Quantized(vectors.reshape(b, t, -1).to(x.dtype), codes, mean_probs)


def gumbel_one_hot(
    logits: Tensor, temperature: float, generator: torch.Generator | None = None
) -> Tensor:
    """Straight-through Gumbel-softmax over the last dimension: one-hot samples forward,
    the tempered softmax's gradient backward (as `F.gumbel_softmax(hard=True)`), with the
    noise from `generator` when given."""
    device_generator = None
    if generator is not None:
        seed = int(torch.randint(2**62, (1,), generator=generator))
        device_generator = torch.Generator(device=logits.device).manual_seed(seed)
    gumbels = -torch.empty_like(logits).exponential_(generator=device_generator).log()
    soft = ((logits + gumbels) / temperature).softmax(dim=-1)
    hard = F.one_hot(soft.argmax(dim=-1), logits.shape[-1]).to(soft.dtype)
    return hard - soft.detach() + soft


def stack_frames(features: Tensor, factor: int) -> Tensor:
    """(B, T, F) -> (B, ceil(T / factor), factor * F), zero-padded at the end."""
    b, t, f = features.shape
    features = F.pad(features, (0, 0, 0, -t % factor))
    return features.reshape(b, -1, factor * f)


def fully_masked(input_mask: Tensor, factor: int) -> Tensor:
    """(B, T) bool mask of input frames -> (B, ceil(T / factor)): True where every input
    frame of the stack is masked (a partial last stack counts its padding as unmasked)."""
    b, t = input_mask.shape
    padded = F.pad(input_mask, (0, -t % factor), value=False)
    return padded.reshape(b, -1, factor).all(dim=-1)


class RandomProjectionQuantizer(nn.Module):
    """Features (B, T, input_dim) -> code ids (B, ceil(T / factor), num_codebooks) from a
    frozen random projection and frozen random codebooks (one each per codebook)."""

    def __init__(
        self,
        input_dim: int,
        factor: int,
        code_dim: int = 16,
        num_codes: int = 8192,
        num_codebooks: int = 1,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.factor = factor
        generator = torch.Generator().manual_seed(seed)
        stacked = factor * input_dim
        bound = math.sqrt(6.0 / (stacked + code_dim))  # Xavier uniform
        projection = (
            torch.rand(num_codebooks, stacked, code_dim, generator=generator) * 2 - 1
        ) * bound
        codebook = torch.randn(num_codebooks, num_codes, code_dim, generator=generator)
        self.register_buffer("projection", projection)
        self.register_buffer("codebook", F.normalize(codebook, dim=-1))

    @torch.no_grad()
    def forward(self, features: Tensor) -> Tensor:
        with torch.autocast(features.device.type, enabled=False):
            stacked = stack_frames(features.float(), self.factor)
            normed = F.layer_norm(stacked, stacked.shape[-1:])  # no affine parameters
            projected = F.normalize(torch.einsum("btf,cfd->btcd", normed, self.projection), dim=-1)
            # nearest unit vector = largest dot product
            return torch.einsum("btcd,cvd->btcv", projected, self.codebook).argmax(dim=-1)
