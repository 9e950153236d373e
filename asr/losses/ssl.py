"""The losses of self-supervised pre-training, as pure functions of tensors and masks.

Legend: B batch, T frames, D vector width, K distractors, C codebooks, V codes, G groups.
Each loss is a mean over the masked frames of the batch (and over the codebooks), computed
in fp32 under any autocast.

- `contrastive_loss` (wav2vec 2.0, w2v-BERT's contrastive module): at each masked frame,
  the context vector must pick its own quantized target among K distractors, the targets
  of other masked frames of the same utterance (`sample_distractors`), by cosine
  similarity over a temperature.
- `diversity_loss`: (G V - perplexity) / (G V) of the mean code distribution, 0 when every
  code is used equally, so the quantizer keeps using its whole codebook.
- `masked_prediction_loss` (w2v-BERT's MLM module, BEST-RQ): cross-entropy of the code ids
  at the masked frames, with the accuracy of the argmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _fp32(x: Tensor) -> Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def sample_distractors(
    mask: Tensor, num_distractors: int, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """mask (B, T) -> indices (B, T, K) of frames of the same utterance and `valid` (B, T, K).

    For each masked frame, K frames drawn uniformly with replacement among the utterance's
    other masked frames; where an utterance has a single masked frame there are none
    (`valid` False; the index is the frame itself). Unmasked frames get their own index."""
    b, t = mask.shape
    indices = torch.arange(t)[None, :, None].expand(b, t, num_distractors).clone()
    valid = torch.zeros(b, t, num_distractors, dtype=torch.bool)
    for row in range(b):
        frames = mask[row].nonzero().flatten().cpu()
        n = len(frames)
        if n < 2:
            continue
        # draw among the n - 1 others: an offset in [1, n) from the frame's own position
        offsets = torch.randint(1, n, (n, num_distractors), generator=generator)
        chosen = (torch.arange(n)[:, None] + offsets) % n
        indices[row, frames] = frames[chosen]
        valid[row, frames] = True
    return indices.to(mask.device), valid.to(mask.device)


def contrastive_loss(
    context: Tensor,
    targets: Tensor,
    mask: Tensor,
    distractors: Tensor,
    valid: Tensor,
    temperature: float = 0.1,
) -> tuple[Tensor, Tensor]:
    """context (B, T, D), targets (B, T, D), mask (B, T), distractors and valid (B, T, K)
    -> (loss, accuracy) over the masked frames.

    A distractor that equals the target exactly (the same code) is left out, as in
    wav2vec 2.0, so the model is not asked to tell a vector from itself."""
    context, targets = _fp32(context), _fp32(targets)
    with torch.autocast(context.device.type, enabled=False):
        b, t, k = distractors.shape
        rows = torch.arange(b, device=targets.device)[:, None, None]
        negatives = targets[rows, distractors]  # (B, T, K, D)
        candidates = torch.cat([targets[:, :, None], negatives], dim=2)  # (B, T, 1 + K, D)
        logits = F.cosine_similarity(context[:, :, None], candidates, dim=-1) / temperature
        same = (negatives == targets[:, :, None]).all(dim=-1)
        excluded = torch.cat([torch.zeros_like(same[..., :1]), same | ~valid], dim=-1)
        logits = logits.masked_fill(excluded, float("-inf"))
        picked = logits[mask]  # (N, 1 + K)
        zeros = torch.zeros(len(picked), dtype=torch.long, device=picked.device)
        loss = F.cross_entropy(picked, zeros) if len(picked) else logits.sum() * 0
        accuracy = (picked.argmax(dim=-1) == 0).float().mean() if len(picked) else loss.detach()
    return loss, accuracy


def code_perplexity(mean_probs: Tensor) -> Tensor:
    """mean_probs (G, V), each row a distribution -> the sum over the groups of
    exp(entropy): G V when every code is used equally, G when one code is."""
    mean_probs = _fp32(mean_probs)
    entropy = -(mean_probs * mean_probs.clamp(min=1e-12).log()).sum(dim=-1)
    return entropy.exp().sum()


def diversity_loss(mean_probs: Tensor) -> Tensor:
    """mean_probs (G, V) -> (G V - perplexity) / (G V), 0 at uniform use, below 1."""
    total = mean_probs.numel()
    return (total - code_perplexity(mean_probs)) / total


def masked_prediction_loss(logits: Tensor, targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """logits (B, T, C, V) or (B, T, V), targets (B, T, C) or (B, T) code ids, mask (B, T)
    -> (loss, accuracy): the cross-entropy and the argmax accuracy over the masked frames and
    the codebooks."""
    if logits.dim() == 3:
        logits, targets = logits[:, :, None], targets[:, :, None]
    if logits.shape[:3] != targets.shape or mask.shape != targets.shape[:2]:
        raise ValueError(
            f"expected logits (B, T, C, V), targets (B, T, C), mask (B, T); got "
            f"{tuple(logits.shape)}, {tuple(targets.shape)}, {tuple(mask.shape)}"
        )
    with torch.autocast(logits.device.type, enabled=False):
        picked, wanted = _fp32(logits[mask]), targets[mask]  # (N, C, V), (N, C)
        if not len(picked):
            zero = logits.float().sum() * 0
            return zero, zero.detach()
        loss = F.cross_entropy(picked.flatten(0, 1), wanted.flatten())
        accuracy = (picked.argmax(dim=-1) == wanted).float().mean()
    return loss, accuracy
