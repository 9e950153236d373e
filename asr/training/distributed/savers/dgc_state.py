"""The Deep Gradient Compression hook's configuration (`distributed.compression`) and
per-rank state (`asr.training.distributed.savers.dgc` is the hook)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from asr.config_keys import ConfigError, check_choice

# The paper's exponential warm-up: each stage keeps a quarter of what the previous sent.
PAPER_WARMUP = (0.75, 0.9375, 0.984375, 0.996)


@dataclass(frozen=True)
class DGCConfig:
    """Keys of `distributed.compression` with `kind: dgc`. The defaults are the setting
    measured closest to dense DDP on the demo (recipes/demo/RESULTS.md: 99.6 %, AdamW's
    second moment frozen and refreshed, every parameter sparse; 111x).

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
      so every part of the model has a second moment; `asr.training.distributed.savers.dgc_adam`).
    - `variance_refresh_steps`: with AdamW, the sparse steps between two refreshes of the
      frozen second moment from the ranks' local estimates (0: never; each costs 2 bytes
      per entry, spread over the steps between refreshes).
    - `selection`: `bucket` (one top-k over each DDP bucket: the largest entries wherever
      they are) or `tensor` (each parameter tensor sends its own share, at least one entry:
      the paper's layer-wise threshold).
    - `exchange`: `allgather` (every rank receives every rank's pairs: (W - 1) k per
      rank, growing with the ranks W) or `reduce_scatter` (each rank sums one region of
      the bucket and all-gathers its largest sums: about 2 (W - 1) / W x k per rank at
      any W; `asr.training.distributed.savers.dgc_reduce`).
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


@dataclass
class StepTraffic:
    """What one rank exchanged in one optimizer step, over all buckets, in bytes.

    - `bucket_bytes`: the gradient buckets' size; `payload_bytes`: this rank's own
      contribution (its index and value pairs; a dense step's whole buckets). Their ratio
      is the compression at any W, one rank included (where nothing crosses a wire).
    - `sent_bytes`, `received_bytes`: what this rank sends and receives over the wire when
      the collectives run as rings (gloo's and NCCL's way at these sizes): an all-gather of
      W payloads moves (W - 1) of them each way per rank, an all-reduce of B bytes
      2 (W - 1) / W x B each way.
    - `dense_bytes`: what DDP's dense ring all-reduce of the same buckets would move each
      way per rank, 2 (W - 1) / W x the buckets' bytes: the reference of `compression`.
      (At W = 2 all three of sent, payload and dense reduce to the old single counts.)
    """

    world: int = 1
    bucket_bytes: int = 0
    payload_bytes: int = 0
    sent_bytes: int = 0
    received_bytes: int = 0
    dense_bytes: int = 0
    sent_entries: int = 0
    entries: int = 0

    @property
    def compression(self) -> float:
        """Dense ring bytes / received bytes (1 for a dense step); with one rank, where
        nothing crosses a wire, bucket bytes / payload bytes."""
        if self.world == 1:
            return self.bucket_bytes / max(self.payload_bytes, 1)
        return self.dense_bytes / max(self.received_bytes, 1)

    @property
    def compression_sent(self) -> float:
        """Dense ring bytes / sent bytes (one rank: as `compression`)."""
        if self.world == 1:
            return self.compression
        return self.dense_bytes / max(self.sent_bytes, 1)

    def ring_share(self, nbytes: int) -> int:
        """Bytes each rank sends (and receives) in a ring all-reduce of `nbytes` bytes."""
        return round(2 * (self.world - 1) * nbytes / self.world)

    def count_bucket(self, buffer: Tensor) -> None:
        """Count a gradient bucket that a dense all-reduce would exchange."""
        self.bucket_bytes += buffer.numel() * buffer.element_size()
        self.dense_bytes += self.ring_share(buffer.numel() * buffer.element_size())
        self.entries += buffer.numel()

    def count_all_reduce(self, tensor: Tensor, entries: bool = True) -> None:
        """Count `tensor` all-reduced whole (`entries`: a gradient's, sent in full)."""
        nbytes = tensor.numel() * tensor.element_size()
        self.payload_bytes += nbytes
        self.sent_bytes += self.ring_share(nbytes)
        self.received_bytes += self.ring_share(nbytes)
        if entries:
            self.sent_entries += tensor.numel()

    def count_all_gather(self, payload: Tensor, entries: int) -> None:
        """Count this rank's `payload` gathered by all ranks (`entries` gradient entries)."""
        nbytes = self.count_payload(payload, entries)
        self.count_exchange(sent=(self.world - 1) * nbytes, received=(self.world - 1) * nbytes)

    def count_payload(self, payload: Tensor, entries: int) -> int:
        """Count this rank's own contribution, `payload` holding `entries` gradient
        entries; its bytes."""
        nbytes = payload.numel() * payload.element_size()
        self.payload_bytes += nbytes
        self.sent_entries += entries
        return nbytes

    def count_exchange(self, sent: int, received: int) -> None:
        """Count bytes this rank sent to and received from the others."""
        self.sent_bytes += sent
        self.received_bytes += received


@dataclass(frozen=True)
class BucketLayout:
    """Where a bucket's parameters lie in its flat buffer: `params` (their storage
    addresses, in buffer order) at `offsets`; `dense` the entries sent whole every step
    (1-D parameters with `dense_vectors`), `segments` the (offset, size) of each tensor
    whose top-k is sent."""

    params: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    dense: Tensor
    segments: tuple[tuple[int, int], ...]


def bucket_layout(params: list[Tensor], dense_vectors: bool, device: torch.device) -> BucketLayout:
    """The layout of a bucket holding `params` in buffer order."""
    dense, segments, offsets, offset = [], [], [], 0
    for param in params:
        size = param.numel()
        offsets.append(offset)
        if dense_vectors and param.dim() <= 1:
            dense.append(torch.arange(offset, offset + size, device=device))
        else:
            segments.append((offset, size))
        offset += size
    indices = torch.cat(dense) if dense else torch.zeros(0, dtype=torch.long, device=device)
    return BucketLayout(
        params=tuple(param.data_ptr() for param in params),
        offsets=tuple(offsets),
        sizes=tuple(param.numel() for param in params),
        dense=indices,
        segments=tuple(segments),
    )


# The per-bucket state tensors of `DGCState`, by attribute name.
STATE_KINDS = ("residual", "velocity", "second_moment", "local_first", "local_second")


@dataclass(frozen=True)
class AdamMoments:
    """AdamW's `betas` and `eps`, for the moments the hook keeps in AdamW runs: the run's
    optimizer config gives them (`optim.betas`, `optim.eps`; no defaults of its own)."""

    beta1: float
    beta2: float
    eps: float


@dataclass
class DGCState:
    """Per-rank state of the hook: the residual v and velocity u (SGD) or Adam moments of
    every bucket, the optimizer step (for the warm-up) and the traffic of the current and
    last step."""

    config: DGCConfig
    momentum: float = 0.0  # SGD's momentum, taken over by the hook (0: error feedback)
    adam: AdamMoments | None = None  # AdamW's moments, taken over by the hook
    total_entries: int = 0  # all gradient entries of the model (for per-bucket clipping)
    process_group: dist.ProcessGroup | None = None
    step: int = 0
    dense_from: int = 0  # where AdamW's dense steps began (a state lost: again)
    residual: dict[int, Tensor] = field(default_factory=dict)
    velocity: dict[int, Tensor] = field(default_factory=dict)
    second_moment: dict[int, Tensor] = field(default_factory=dict)  # Adam's v per bucket
    # AdamW: this rank's unmasked Adam moments of its own gradient (for refreshes)
    local_first: dict[int, Tensor] = field(default_factory=dict)
    local_second: dict[int, Tensor] = field(default_factory=dict)
    bucket_steps: dict[int, int] = field(default_factory=dict)  # Adam's t per bucket
    traffic: StepTraffic = field(default_factory=StepTraffic)
    last_traffic: StepTraffic = field(default_factory=StepTraffic)
    last_sent: dict[int, Tensor] = field(default_factory=dict)  # bucket -> indices sent
    generator: torch.Generator | None = None
    learning_rate: Callable[[], float] | None = None  # the optimizer's current rate
    layouts: dict[int, BucketLayout] = field(default_factory=dict)
    # per-parameter state (by storage address) waiting for the bucket that will hold it:
    # after DDP rebuilt its buckets, or restored from a checkpoint
    stash: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    stash_steps: dict[int, int] = field(default_factory=dict)  # Adam's t per parameter
    generator_state: Tensor | None = None  # restored, for the next generator made

    def world_size(self) -> int:
        return dist.get_world_size(self.process_group)

    def rate(self) -> float:
        """The optimizer's learning rate of this step (1 when no optimizer is attached)."""
        rate = self.learning_rate() if self.learning_rate is not None else 1.0
        return rate if rate > 0 else 1.0

    @property
    def freezes_variance(self) -> bool:
        """An AdamW run: dense steps, then a frozen second moment."""
        return self.adam is not None

    def sparse_step(self) -> int:
        """This step counted from the end of AdamW's dense steps (negative during them);
        the step itself in SGD runs."""
        if not self.freezes_variance:
            return self.step
        return self.step - self.dense_from - self.config.variance_freeze_step

    def in_dense_adam(self) -> bool:
        """Whether this step is one of an AdamW run's dense steps."""
        return self.freezes_variance and self.sparse_step() < 0

    def refreshes_variance(self) -> bool:
        """Whether this step of an AdamW run replaces the frozen second moment first."""
        every = self.config.variance_refresh_steps
        step = self.sparse_step()
        return self.freezes_variance and every > 0 and step > 0 and step % every == 0

    def sparsity(self) -> float:
        """This step's sparsity (in AdamW runs the warm-up follows the dense steps)."""
        step = self.sparse_step()
        return 0.0 if step < 0 else self.config.sparsity_at(step)

    @property
    def moments_in_hook(self) -> bool:
        """Whether the hook applies the optimizer's moments (the optimizer must then be
        plain SGD): SGD's momentum correction, or AdamW's directions."""
        return self.momentum > 0 or self.adam is not None

    def random(self, device: torch.device) -> torch.Generator:
        if self.generator is None or self.generator.device != device:
            rank = dist.get_rank(self.process_group) if dist.is_initialized() else 0
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(self.config.seed + rank)
            if self.generator_state is not None:
                self.generator.set_state(self.generator_state)
                self.generator_state = None
        return self.generator

    def end_step(self) -> None:
        self.last_traffic, self.traffic = self.traffic, StepTraffic()
        self.step += 1


def bucket_buffer(buffers: dict[int, Tensor], index: int, like: Tensor) -> Tensor:
    """The state tensor of bucket `index`, zeros when new (or when DDP rebuilt its buckets)."""
    buffer = buffers.get(index)
    if buffer is None or buffer.shape != like.shape:
        buffer = buffers[index] = torch.zeros_like(like)
    return buffer
