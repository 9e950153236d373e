"""The Deep Gradient Compression hook's configuration: the keys of
`distributed.compression` (`DGCConfig`), and the AdamW moments the hook takes over
(`AdamMoments`)."""

from __future__ import annotations

from dataclasses import dataclass

from asr.config_keys import ConfigError, check_choice

# The paper's exponential warm-up: each stage keeps a quarter of what the previous sent.
PAPER_WARMUP = (0.75, 0.9375, 0.984375, 0.996)


@dataclass(frozen=True)
class DGCConfig:
    """Keys of `distributed.compression` with `kind: dgc`. The defaults are the setting
    measured closest to dense DDP on the demo (recipes/demo/RESULTS.md, "A frozen second
    moment").

    - `kind`: `dgc`, the one gradient compression.
    - `sparsity`: fraction of the entries not sent per step after warm-up (of each
      bucket's or each tensor's, as `selection` says; besides the `dense_vectors`).
    - `warmup_sparsities`: the sparsities of the warm-up stages (the paper's by default).
    - `warmup_steps`: the optimizer steps each warm-up stage lasts (0: no warm-up).
    - `sample_fraction`: share of the entries sampled to estimate the top-k threshold.
    - `clip_norm`: local gradient clipping threshold before accumulation (null: the
      trainer's `gradient_clip_val`, which then no longer clips after the exchange).
    - `variance_freeze_step`: with AdamW, the dense AdamW steps before its second moment
      freezes and its first moment moves into the hook (past the loss's CTC-only warm-up,
      so every part of the model has a second moment;
      `asr.training.distributed.communication.dgc_adam`).
    - `variance_refresh_steps`: with AdamW, the sparse steps between two refreshes of the
      frozen second moment from the ranks' local estimates (0: never; each costs 2 bytes
      per entry, spread over the steps between refreshes).
    - `selection`: `bucket` (one top-k over each DDP bucket: the largest entries wherever
      they are) or `tensor` (each parameter tensor sends its own share, at least one entry:
      the paper's layer-wise threshold).
    - `exchange`: `allgather` (every rank receives every rank's pairs: (W - 1) k per
      rank, growing with the ranks W) or `reduce_scatter` (each rank sums one region of
      the bucket and all-gathers its largest sums: about 2 (W - 1) / W x k per rank at
      any W; `asr.training.distributed.communication.dgc`).
    - `dense_vectors`: 1-D parameters (biases, normalization scales and shifts) are sent
      whole every step, as the paper's code does.
    - `momentum_masking`: clear the momentum (SGD's velocity, or AdamW's first moment)
      where an entry was sent.
    - `seed`: of the threshold sampling (each rank adds its rank).
    """

    kind: str = "dgc"
    sparsity: float = 0.996
    warmup_sparsities: tuple[float, ...] = PAPER_WARMUP
    warmup_steps: int = 0
    sample_fraction: float = 0.01
    clip_norm: float | None = None
    variance_freeze_step: int = 500
    variance_refresh_steps: int = 500
    selection: str = "bucket"
    exchange: str = "allgather"
    dense_vectors: bool = False
    momentum_masking: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "warmup_sparsities", tuple(self.warmup_sparsities))
        for value in (self.sparsity, *self.warmup_sparsities):
            if not 0.0 <= value < 1.0:
                raise ConfigError(
                    f"distributed.compression sparsities must be in [0, 1), got {value}"
                )
        if not 0.0 < self.sample_fraction <= 1.0:
            raise ConfigError(
                "distributed.compression.sample_fraction must be in (0, 1], got "
                f"{self.sample_fraction}"
            )
        check_choice("distributed.compression.kind", self.kind, ["dgc"])
        check_choice("distributed.compression.selection", self.selection, ["bucket", "tensor"])
        check_choice(
            "distributed.compression.exchange", self.exchange, ["allgather", "reduce_scatter"]
        )
        if self.variance_freeze_step < 1:
            raise ConfigError(
                "distributed.compression.variance_freeze_step must be >= 1, got "
                f"{self.variance_freeze_step}"
            )
        if self.variance_refresh_steps < 0:
            raise ConfigError(
                "distributed.compression.variance_refresh_steps must be >= 0, got "
                f"{self.variance_refresh_steps}"
            )
        if self.warmup_steps < 0:
            raise ConfigError(
                f"distributed.compression.warmup_steps must be >= 0, got {self.warmup_steps}"
            )
        if self.clip_norm is not None and not self.clip_norm > 0:
            raise ConfigError(
                f"distributed.compression.clip_norm must be > 0 or null, got {self.clip_norm}"
            )

    def sparsity_at(self, step: int) -> float:
        """The sparsity of optimizer step `step` (0-based)."""
        if self.warmup_steps > 0:
            stage = step // self.warmup_steps
            if stage < len(self.warmup_sparsities):
                return self.warmup_sparsities[stage]
        return self.sparsity


@dataclass(frozen=True)
class AdamMoments:
    """AdamW's `betas` and `eps`, for the moments the hook keeps in AdamW runs: the run's
    optimizer config gives them (`optim.betas`, `optim.eps`; no defaults of its own)."""

    beta1: float
    beta2: float
    eps: float
