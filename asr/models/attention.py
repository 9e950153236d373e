"""Self-attention with relative positions (Transformer-XL, as the Conformer uses it), the
sinusoidal encodings both encoder and decoder use, and length masks.

Legend: B batch, T frames, D model width, H heads, Dh = D / H.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def lengths_to_mask(lens: Tensor, max_len: int) -> Tensor:
    """(B,) lengths -> (B, T) bool mask, True on valid frames."""
    return torch.arange(max_len, device=lens.device) < lens[:, None]


def sinusoids(positions: Tensor, dim: int) -> Tensor:
    """Sinusoidal encodings of float positions (L,) -> (L, dim), sin and cos interleaved."""
    inv_freq = torch.exp(
        torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32)
        * (-math.log(10000.0) / dim)
    )
    angles = positions[:, None] * inv_freq[None, :]  # (L, dim/2)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)


def relative_positions(
    length: int, d_model: int, device=None, dtype=None, num_keys: int | None = None
) -> Tensor:
    """Sinusoidal encodings of relative positions K-1, K-2, ..., -(T-1): (T+K-1, D) for T
    queries that are the last T of K keys (K = T unless given: (2T-1, D))."""
    num_keys = length if num_keys is None else num_keys
    pos = torch.arange(num_keys - 1, -length, -1, device=device, dtype=torch.float32)
    return sinusoids(pos, d_model).to(dtype)


def rel_shift(scores: Tensor) -> Tensor:
    """(..., T, T+K-1) scores against positions K-1..-(T-1) -> (..., T, K) query-key scores,
    where the T queries are the last T of the K keys (K = T in training).

    out[..., i, j] = scores[..., i, T-1-i+j], the score for relative position
    (K-T+i) - j. A strided view: row i starts one element earlier than the row above.
    """
    *_, t, p = scores.shape
    k = p - t + 1
    if k < t:
        raise ValueError(
            f"rel_shift expects (..., T, T+K-1) scores with K >= T, got {tuple(scores.shape)}"
        )
    scores = scores.contiguous()
    strides = scores.stride()
    return scores.as_strided(
        (*scores.shape[:-1], k),
        (*strides[:-2], strides[-2] - 1, 1),
        scores.storage_offset() + t - 1,
    )


class RelPositionMultiHeadAttention(nn.Module):
    """Transformer-XL self-attention: content and position terms with learned biases u, v.

    The position term and the key padding mask are folded into one float ``attn_mask``
    for ``F.scaled_dot_product_attention``, so a fused kernel computes the softmax.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} must be divisible by num_heads={num_heads}")
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.pos = nn.Linear(d_model, d_model, bias=False)
        self.out = nn.Linear(d_model, d_model)
        self.pos_bias_u = nn.Parameter(torch.zeros(num_heads, self.head_dim))
        self.pos_bias_v = nn.Parameter(torch.zeros(num_heads, self.head_dim))

    def forward(
        self,
        x: Tensor,
        pos_emb: Tensor,
        mask: Tensor,
        allowed: Tensor | None = None,
        cache: Tensor | None = None,
    ) -> Tensor:
        """x (B, T, D) queries and keys; ``cache`` (B, C, D) earlier inputs that are keys
        only (streaming), so K = C + T keys; pos_emb (T+K-1, D); mask (B, K) True on valid
        keys; ``allowed`` (T, K) True where a query may see a key (chunked attention), or
        None for all -> (B, T, D)."""
        b, t, d = x.shape
        source = x if cache is None else torch.cat([cache, x], dim=1)
        k_len = source.size(1)
        qkv = self.qkv(source).view(b, k_len, 3, self.num_heads, self.head_dim)
        q, k, v = qkv[:, k_len - t :, 0], qkv[:, :, 1], qkv[:, :, 2]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T|K, Dh)
        p = self.pos(pos_emb).view(t + k_len - 1, self.num_heads, self.head_dim).permute(1, 2, 0)
        scale = self.head_dim**-0.5
        # Position term: (q + v) . p over relative positions, shifted to (query, key) pairs.
        pos_scores = rel_shift(torch.matmul((q + self.pos_bias_v[:, None, :]) * scale, p))
        q = q + self.pos_bias_u[:, None, :]
        dropout = self.dropout if self.training else 0.0
        visible = mask[:, None, None, :]  # (B, 1, 1, K)
        if allowed is not None:
            visible = visible & allowed  # (B, 1, T, K)
        if x.device.type == "cpu":
            y = _attention_on_cpu(q * scale, k, v, pos_scores, visible, dropout)
        else:  # a fused kernel; SDPA scales q.k itself, then adds attn_mask
            bias = pos_scores.masked_fill(~visible, _min(pos_scores))
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias.to(q.dtype), dropout_p=dropout
            )
        return self.out(y.transpose(1, 2).reshape(b, t, d))


def _min(x: Tensor) -> float:
    return torch.finfo(x.dtype).min


def _attention_on_cpu(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor, visible: Tensor, dropout: float
) -> Tensor:
    """softmax(q k^T + bias, keys not `visible` masked) v with q (B, H, T, Dh) already
    scaled and `visible` broadcastable to (B, H, T, K). On CPUs
    SDPA with a bias that needs a gradient falls back to its unfused math path, which
    checks for fully masked rows and copies the bias; this is the same math in fewer
    passes over the scores."""
    scores = torch.matmul(q, k.transpose(-1, -2)) + bias
    scores = scores.masked_fill_(~visible, _min(scores))
    weights = F.dropout(scores.softmax(-1), dropout) if dropout else scores.softmax(-1)
    return torch.matmul(weights, v)
