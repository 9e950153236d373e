"""Deep Gradient Compression (Lin et al., ICLR 2018, arXiv 1712.01887) as a DDP
communication hook.

Instead of all-reducing each gradient bucket, every rank sends only the k entries of
largest magnitude of what it has accumulated, as (index, value) pairs gathered by all
ranks; the rest stays in a per-rank residual and is sent when it has grown large enough,
so no gradient is lost, only delayed. Following the paper and its code:

- **Top-k through a threshold from a sample**: the k-th largest magnitude is estimated on
  a random sample of `sample_fraction` of the entries; those above it are cut to exactly k
  by a top-k among them (an exact top-k only when the sample under-selects). `selection:
  bucket` (default) takes one top-k over each DDP bucket; `selection: tensor` the paper's
  layer-wise one, each parameter tensor sending its own share (at least one entry).
  With `dense_vectors`, 1-D parameters (biases, normalization scales and shifts; 0.8 % of
  the demo model) are sent whole every step as values at known places, as the paper's code
  does. On the demo, AdamW, the bucket-wide top-k trained better (recipes/demo/RESULTS.md).
- **Momentum correction** (momentum-SGD runs): the hook keeps the velocity
  u <- m u + g and accumulates v <- v + u, sends the top-k of v, and the optimizer
  applies the exchanged sum as plain SGD (its own momentum is off). **Momentum factor
  masking** (`momentum_masking`) clears u and v where they were sent, so stale momentum
  does not push a coordinate again.
- **AdamW runs** (`adamw: gradient | direction | frozen_variance`). `gradient`: error
  feedback on the gradient only (v <- v + g) and AdamW after the exchange, on the sparse sum. Adam's
  moments cannot be corrected the way SGD's velocity is: it divides each coordinate by
  the root of its second moment, so a coordinate that arrives once every ~1/(1 - sparsity)
  steps with the sum of those steps moves about as far as after one dense step, and
  training slows by about that factor (measured on the demo: recipes/demo/RESULTS.md).
  `direction` (the default): each rank keeps its own Adam moments of its local gradient in
  the hook and accumulates the update lr_t m / (sqrt(v) + eps) (bias-corrected, at each
  step's rate); the top-k of that is exchanged, divided by the current rate, and the
  optimizer applies the average as SGD with AdamW's rate and decoupled weight decay, so a
  delayed coordinate keeps every step's movement, whatever the schedule did meanwhile.
  Momentum masking clears Adam's first moment where an entry was sent (its second moment
  stays). `frozen_variance` (1-bit Adam's idea, Tang et al. 2021, arXiv 2102.02888): the
  first `variance_freeze_step` steps are dense AdamW (the averaged gradient all-reduced,
  every rank keeping the same moments of it); then the second moment is frozen and each
  rank keeps only its own first moment, sending the top-k of the accumulated
  lr_t m / (sqrt(v_frozen) + eps). That update is linear in the gradient, so the ranks'
  mean is exactly dense Adam with the frozen second moment (the paper's momentum
  correction with a fixed per-coordinate scale), and no rank's batch noise enters the
  second moment (in `direction` mode each rank's own moments see the noise of a batch N
  times smaller than the global one). The sparsity warm-up starts after the dense steps.
  Each rank's direction is clamped to the largest one Adam can take with its own moments
  ((1 - b1) / sqrt((1 - b2)(1 - b1^2 / b2)), 1.7 for the demo's betas): a coordinate whose
  second moment was small when it froze would otherwise take an unbounded step when its
  gradient grows (on the demo: a divergence at step 1,730 of 7,078). Where the clamp acts
  the update is no longer linear; elsewhere it is.
  A frozen second moment goes stale as the gradients change scale (on the demo some
  coordinates' root second moment moves 3x in a few epochs, and all of them shrink at the
  end of a run), so every `variance_refresh_steps` sparse steps it is replaced by the
  ranks' mean of a local estimate of the dense second moment, exchanged in bf16: each
  rank keeps unmasked moments m_a, v_a of its own gradient, and since v_a - m_a^2 holds N
  times the noise of the averaged gradient, m_a^2 + (v_a - m_a^2) / N estimates its second
  moment. Between refreshes the update stays linear in the gradient.
- **Local gradient clipping** before accumulation, at `clip_norm` x N^-1/2 for N ranks
  (the N ranks' sum then stays within `clip_norm`). The hook sees one bucket at a time,
  so each bucket is clipped at that threshold times the square root of its share of all
  gradient entries.
- **Warm-up**: the sparsity rises through `warmup_sparsities` (75 %, 93.75 %, 98.4375 %,
  99.6 % by default), `warmup_steps` optimizer steps each, before reaching `sparsity`.

At sparsity 0 the hook all-reduces, giving exactly DDP's averaged gradient. Each step's
bytes are counted: `sent_bytes` what this rank contributes (indices as int32 plus values),
`dense_bytes` the bucket bytes a dense all-reduce exchanges; their ratio is the
compression ratio. Residual, velocity and the hook's Adam moments are per-rank state: the
state is kept per bucket, moved to the new buckets when DDP rebuilds them, and written
beside `last.ckpt` by every rank (`asr.training.distributed.dgc_resume`), so a resumed run
continues with what still waited in the residual.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from asr.config_keys import ConfigError, check_choice
from asr.training.distributed.hooks import comm_hook

# The paper's exponential warm-up: each stage keeps a quarter of what the previous sent.
PAPER_WARMUP = (0.75, 0.9375, 0.984375, 0.996)
INDEX_DTYPE = torch.int32
ADAMW_MODES = ("direction", "frozen_variance", "gradient")


@dataclass(frozen=True)
class DGCConfig:
    """Keys of `distributed.compression` with `kind: dgc`.

    - `sparsity`: fraction of the entries not sent per step after warm-up (of each
      bucket's or each tensor's, as `selection` says; besides the `dense_vectors`).
    - `warmup_sparsities`, `warmup_steps`: the sparsities of the warm-up stages and the
      optimizer steps each lasts (0: no warm-up).
    - `sample_fraction`: share of the entries sampled to estimate the top-k threshold.
    - `clip_norm`: local gradient clipping threshold before accumulation (null: the
      trainer's `gradient_clip_val`, which then no longer clips after the exchange).
    - `adamw`: with an AdamW optimizer, `direction` (its moments move into the hook),
      `frozen_variance` (dense AdamW for `variance_freeze_step` steps, then its second
      moment frozen and the first moment in the hook) or `gradient` (error feedback on the
      gradient, AdamW after the exchange).
    - `variance_freeze_step`: the dense AdamW steps of `frozen_variance` (past the loss's
      CTC-only warm-up, so every part of the model has a second moment).
    - `variance_refresh_steps`: with `frozen_variance`, the sparse steps between two
      refreshes of the second moment from the ranks' local estimates (0: never; each costs
      2 bytes per entry, spread over the steps between refreshes).
    - `selection`: `bucket` (one top-k over each DDP bucket: the largest entries wherever
      they are) or `tensor` (each parameter tensor sends its own share, at least one entry:
      the paper's layer-wise threshold).
    - `dense_vectors`: 1-D parameters (biases, normalization scales and shifts) are sent
      whole every step, as the paper's code does.
    - `momentum_masking`: clear the momentum (SGD's velocity, or AdamW's first moment in
      `direction` mode) where an entry was sent.
    - `seed`: of the threshold sampling (each rank adds its rank).
    """

    kind: str = "dgc"
    sparsity: float = 0.999
    warmup_sparsities: tuple[float, ...] = PAPER_WARMUP
    warmup_steps: int = 0
    sample_fraction: float = 0.01
    clip_norm: float | None = None
    adamw: str = "direction"
    variance_freeze_step: int = 500
    variance_refresh_steps: int = 0
    selection: str = "bucket"
    dense_vectors: bool = True
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
        check_choice("distributed.compression.adamw", self.adamw, ADAMW_MODES)
        check_choice("distributed.compression.selection", self.selection, ["bucket", "tensor"])
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


def check_variance_freeze(config: DGCConfig, first_full_loss_step: int) -> None:
    """`frozen_variance` must freeze after every part of the model has had gradients (the
    loss's CTC-only warm-up ends at `first_full_loss_step`): a part without a second moment
    would be divided by eps."""
    if config.variance_freeze_step <= first_full_loss_step:
        raise ConfigError(
            f"distributed.compression.variance_freeze_step={config.variance_freeze_step} "
            f"freezes AdamW's second moment before the transducer loss starts (step "
            f"{first_full_loss_step}, model.loss.transducer_start_step): the predictor and "
            "joiner would have none. Make it a few hundred steps larger."
        )


@dataclass
class StepTraffic:
    """What one rank exchanged in one optimizer step, over all buckets."""

    sent_bytes: int = 0
    dense_bytes: int = 0
    sent_entries: int = 0
    entries: int = 0

    @property
    def compression(self) -> float:
        """Dense bytes / sent bytes (1 for a dense step)."""
        return self.dense_bytes / max(self.sent_bytes, 1)


@dataclass(frozen=True)
class AdamMoments:
    """AdamW's `betas` and `eps`, for the moments the hook keeps in `direction` mode."""

    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-8


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
    dense_from: int = 0  # where `frozen_variance`'s dense steps began (a state lost: again)
    residual: dict[int, Tensor] = field(default_factory=dict)
    velocity: dict[int, Tensor] = field(default_factory=dict)
    second_moment: dict[int, Tensor] = field(default_factory=dict)  # Adam's v per bucket
    # frozen_variance: this rank's unmasked Adam moments of its own gradient (for refreshes)
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
        """AdamW's `frozen_variance` mode: dense steps, then a frozen second moment."""
        return self.adam is not None and self.config.adamw == "frozen_variance"

    def in_dense_adam(self) -> bool:
        """Whether this step is one of `frozen_variance`'s dense AdamW steps."""
        return (
            self.freezes_variance and self.step - self.dense_from < self.config.variance_freeze_step
        )

    def refreshes_variance(self) -> bool:
        """Whether this step of `frozen_variance` replaces the second moment first."""
        every = self.config.variance_refresh_steps
        if not self.freezes_variance or every == 0:
            return False
        sparse_step = self.step - self.dense_from - self.config.variance_freeze_step
        return sparse_step > 0 and sparse_step % every == 0

    def sparsity(self) -> float:
        """This step's sparsity (with `frozen_variance` the warm-up follows the dense steps)."""
        step = self.step
        if self.freezes_variance:
            step -= self.dense_from + self.config.variance_freeze_step
            if step < 0:
                return 0.0
        return self.config.sparsity_at(step)

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


def top_k_indices(
    magnitudes: Tensor, k: int, sample_fraction: float, generator: torch.Generator
) -> Tensor:
    """Indices of the `k` largest entries of the 1D tensor `magnitudes` (ties broken
    arbitrarily), found through a threshold estimated on a random sample."""
    n = magnitudes.numel()
    if k >= n:
        return torch.arange(n, device=magnitudes.device)
    samples = min(n, max(math.ceil(n * sample_fraction), 1))
    picked = torch.randint(n, (samples,), device=magnitudes.device, generator=generator)
    sample = magnitudes[picked]
    k_sample = min(samples, max(1, math.ceil(samples * k / n)))
    threshold = torch.topk(sample, k_sample, sorted=False).values.min()
    candidates = torch.nonzero(magnitudes >= threshold).squeeze(1)
    if candidates.numel() < k:  # the sample over-estimated the threshold
        return torch.topk(magnitudes, k, sorted=False).indices
    best = torch.topk(magnitudes[candidates], k, sorted=False).indices
    return candidates[best]


def clip_locally(state: DGCState, grad: Tensor) -> Tensor:
    """`grad` (one bucket) scaled down to `clip_norm` x N^-1/2 x sqrt(its share of all
    gradient entries) when its norm is above that; as it is otherwise or without
    `clip_norm`."""
    if state.config.clip_norm is None:
        return grad
    share = grad.numel() / max(state.total_entries, grad.numel())
    limit = state.config.clip_norm * math.sqrt(share / state.world_size())
    norm = float(torch.linalg.vector_norm(grad))
    return grad * (limit / norm) if norm > limit else grad


def _buffer(buffers: dict[int, Tensor], index: int, like: Tensor) -> Tensor:
    """The state tensor of bucket `index`, zeros when new (or when DDP rebuilt its buckets)."""
    buffer = buffers.get(index)
    if buffer is None or buffer.shape != like.shape:
        buffer = buffers[index] = torch.zeros_like(like)
    return buffer


def adam_direction(state: DGCState, index: int, grad: Tensor, frozen: bool = False) -> Tensor:
    """Update this rank's Adam moments of bucket `index` with `grad` and return the
    bias-corrected direction m_hat / (sqrt(v_hat) + eps) (AdamW's step before the rate).
    `frozen`: the second moment stays as the dense steps left it."""
    adam = state.adam
    assert adam is not None
    known = state.second_moment.get(index)
    fresh = known is None or known.shape != grad.shape
    if fresh and frozen:
        raise RuntimeError(
            f"DGC bucket {index} has no second moment to freeze: its state was lost (a "
            "checkpoint resumed without the per-rank DGC state?)"
        )
    first = _buffer(state.velocity, index, grad)
    second = _buffer(state.second_moment, index, grad)
    step = state.bucket_steps[index] = 1 if fresh else state.bucket_steps.get(index, 0) + 1
    first.mul_(adam.beta1).add_(grad, alpha=1 - adam.beta1)
    if frozen:  # last updated at the last dense step
        step_of_second = min(step, state.config.variance_freeze_step)
    else:
        second.mul_(adam.beta2).addcmul_(grad, grad, value=1 - adam.beta2)
        step_of_second = step
    denominator = (second / (1 - adam.beta2**step_of_second)).sqrt_().add_(adam.eps)
    direction = (first / (1 - adam.beta1**step)).div_(denominator)
    if frozen:  # a coordinate whose second moment was small when it froze: Adam's own bound
        bound = adam_step_bound(adam)
        direction.clamp_(-bound, bound)
    return direction


def adam_step_bound(adam: AdamMoments) -> float:
    """The largest |m / sqrt(v)| Adam can take with its own moments (Cauchy-Schwarz over
    the two averages: (1 - b1) / sqrt((1 - b2) (1 - b1^2 / b2))); infinite if b1^2 >= b2."""
    ratio = adam.beta1**2 / adam.beta2
    if ratio >= 1:
        return math.inf
    return (1 - adam.beta1) / math.sqrt((1 - adam.beta2) * (1 - ratio))


def track_local_moments(state: DGCState, index: int, grad: Tensor) -> None:
    """Update this rank's unmasked moments of its own gradient (`frozen_variance` with
    refreshes); they start from the shared moments the dense steps left."""
    adam = state.adam
    assert adam is not None
    first, second = state.local_first.get(index), state.local_second.get(index)
    if first is None or first.shape != grad.shape:
        first = state.local_first[index] = state.velocity[index].clone()
        second = state.local_second[index] = state.second_moment[index].clone()
    assert second is not None
    first.mul_(adam.beta1).add_(grad, alpha=1 - adam.beta1)
    second.mul_(adam.beta2).addcmul_(grad, grad, value=1 - adam.beta2)


def refresh_second_moment(state: DGCState, index: int) -> None:
    """Replace bucket `index`'s frozen second moment by the ranks' mean of
    m_a^2 + (v_a - m_a^2) / N (this rank's local moments: an estimate of the averaged
    gradient's second moment), all-reduced in bf16; waits for the exchange."""
    world = state.world_size()
    first, second = state.local_first[index], state.local_second[index]
    mean_square = first * first
    estimate = mean_square.add_((second - mean_square).clamp_(min=0.0), alpha=1.0 / world)
    shared = estimate.to(torch.bfloat16)
    dist.all_reduce(shared, group=state.process_group)
    state.traffic.sent_bytes += shared.numel() * shared.element_size()
    # kept unnormalized, as Adam keeps v: the frozen bias correction divides it back
    adam = state.adam
    assert adam is not None
    steps = min(state.bucket_steps.get(index, 0) + 1, state.config.variance_freeze_step)
    state.second_moment[index].copy_(shared.float().div_(world)).mul_(1 - adam.beta2**steps)


def accumulate(state: DGCState, index: int, grad: Tensor, rate: float = 1.0) -> Tensor:
    """Fold this step's local gradient `grad` (a flat bucket) into the residual of bucket
    `index` and return that residual (`rate`: the step's learning rate, for AdamW's
    directions)."""
    grad = clip_locally(state, grad.float() if grad.dtype != torch.float64 else grad)
    residual = _buffer(state.residual, index, grad)
    if state.freezes_variance and state.config.variance_refresh_steps > 0:
        track_local_moments(state, index, grad)
        if state.refreshes_variance():
            refresh_second_moment(state, index)
    if state.adam is not None:
        # The update itself (rate x direction): a coordinate sent later, at another rate,
        # still moves by what each step asked (decode divides by the rate of the send).
        direction = adam_direction(state, index, grad, frozen=state.freezes_variance)
        residual.add_(direction, alpha=rate)
    elif state.momentum > 0:
        velocity = _buffer(state.velocity, index, grad)
        velocity.mul_(state.momentum).add_(grad)
        residual.add_(velocity)
    else:
        residual.add_(grad)
    return residual


def per_parameter(state: DGCState) -> tuple[dict[int, dict[str, Tensor]], dict[int, int]]:
    """This rank's state per parameter (keyed by storage address): each bucket's tensors cut
    at its parameters' offsets (views), with what still waits in the stash; and Adam's step
    count per parameter."""
    tensors = {ptr: dict(kinds) for ptr, kinds in state.stash.items()}
    steps = dict(state.stash_steps)
    for index, layout in state.layouts.items():
        places = list(zip(layout.params, layout.offsets, layout.sizes, strict=True))
        for kind in STATE_KINDS:
            flat = getattr(state, kind).get(index)
            if flat is None or flat.numel() != sum(layout.sizes):
                continue
            for ptr, offset, size in places:
                tensors.setdefault(ptr, {})[kind] = flat[offset : offset + size]
        if index in state.bucket_steps:
            steps.update(dict.fromkeys(layout.params, state.bucket_steps[index]))
    return tensors, steps


def clear_buckets(state: DGCState) -> None:
    """Forget every bucket's layout and state (what is to be kept is in the stash)."""
    for kind in STATE_KINDS:
        getattr(state, kind).clear()
    state.bucket_steps.clear()
    state.layouts.clear()


def _stash_all(state: DGCState) -> None:
    """Move every bucket's state to the per-parameter stash (DDP rebuilt its buckets)."""
    state.stash, state.stash_steps = per_parameter(state)
    clear_buckets(state)


def _unstash(state: DGCState, index: int, layout: BucketLayout, like: Tensor) -> None:
    """Give bucket `index` (laid out as `layout`) the stashed state of its parameters;
    zeros where a parameter has none."""
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    for kind in STATE_KINDS:
        places = [
            (ptr, offset, size)
            for ptr, offset, size in zip(layout.params, layout.offsets, layout.sizes, strict=True)
            if kind in state.stash.get(ptr, {})
        ]
        if not places:
            continue
        flat = torch.zeros(sum(layout.sizes), dtype=dtype, device=like.device)
        for ptr, offset, size in places:
            flat[offset : offset + size] = state.stash[ptr].pop(kind).reshape(-1).to(flat)
        getattr(state, kind)[index] = flat
    steps = [state.stash_steps.pop(ptr) for ptr in layout.params if ptr in state.stash_steps]
    if steps:
        state.bucket_steps[index] = max(steps)
    for ptr in layout.params:
        if not state.stash.get(ptr, True):
            del state.stash[ptr]


def current_layout(state: DGCState, bucket: dist.GradBucket) -> BucketLayout:
    """The layout of `bucket`, cached. When DDP rebuilt its buckets (after the first step,
    in gradient-ready order), every bucket's state moves to the buckets that now hold its
    parameters, through the stash: nothing waiting in a residual is lost."""
    index, params = bucket.index(), bucket.parameters()
    known = state.layouts.get(index)
    if known is not None and known.params == tuple(p.data_ptr() for p in params):
        return known
    if known is not None:
        _stash_all(state)
    layout = bucket_layout(params, state.config.dense_vectors, bucket.buffer().device)
    state.layouts[index] = layout
    _unstash(state, index, layout, bucket.buffer())
    return layout


def select(state: DGCState, layout: BucketLayout, residual: Tensor, sparsity: float) -> Tensor:
    """Indices of the entries of `residual` to send besides the dense ones: with
    `selection: bucket` the top k = (1 - sparsity) x the bucket's other entries; with
    `selection: tensor` the top-k of each tensor, k = its size x (1 - sparsity), at least
    one (the paper's layer-wise threshold: every layer moves each step, whatever the scale
    of its gradients)."""
    magnitudes = residual.abs()
    generator = state.random(residual.device)
    fraction = state.config.sample_fraction
    if state.config.selection == "bucket":
        sparse_entries = residual.numel() - layout.dense.numel()
        if sparse_entries == 0:
            return torch.zeros(0, dtype=torch.long, device=residual.device)
        magnitudes[layout.dense] = -1.0  # sent anyway: never among the top-k
        k = max(1, round(sparse_entries * (1.0 - sparsity)))
        return top_k_indices(magnitudes, k, fraction, generator)
    parts = [
        offset
        + top_k_indices(
            magnitudes[offset : offset + size],
            max(1, round(size * (1.0 - sparsity))),
            fraction,
            generator,
        )
        for offset, size in layout.segments
    ]
    if not parts:
        return torch.zeros(0, dtype=torch.long, device=residual.device)
    return torch.cat(parts)


@comm_hook
def dgc_hook(state: DGCState, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """The DDP communication hook: sparse exchange of one bucket (dense at sparsity 0)."""
    buffer = bucket.buffer()
    world = state.world_size()
    sparsity = state.sparsity()
    index = bucket.index()
    traffic = state.traffic
    traffic.dense_bytes += buffer.numel() * buffer.element_size()
    traffic.entries += buffer.numel()
    is_last = bucket.is_last()
    if sparsity == 0.0 and not state.moments_in_hook and not state.residual:
        traffic.sent_bytes += buffer.numel() * buffer.element_size()
        traffic.sent_entries += buffer.numel()
        buffer.copy_(clip_locally(state, buffer))
        work = dist.all_reduce(buffer.div_(world), group=state.process_group, async_op=True)
        return _finish(work.get_future(), state, is_last, lambda fut: fut.value()[0])
    if state.in_dense_adam():
        return _dense_adam(state, bucket)

    if buffer.numel() >= 2**31:
        raise ValueError(
            f"a gradient bucket of {buffer.numel()} entries is too large for int32 indices: "
            "lower DDP's bucket_cap_mb"
        )
    layout = current_layout(state, bucket)
    rate = state.rate()  # read once: a bucket decoded after the step's last one sees this rate
    residual = accumulate(state, index, buffer, rate)
    indices = select(state, layout, residual, sparsity)
    dense_values = residual[layout.dense]
    values = residual[indices]
    sent = torch.cat([layout.dense, indices])
    residual[sent] = 0.0
    state.last_sent[index] = sent
    if state.config.momentum_masking and state.moments_in_hook:
        state.velocity[index][sent] = 0.0  # momentum factor masking (SGD's u, or Adam's m)
    payload = torch.cat(
        [
            dense_values.view(torch.uint8),
            indices.to(INDEX_DTYPE).view(torch.uint8),
            values.view(torch.uint8),
        ]
    )
    traffic.sent_bytes += payload.numel()
    traffic.sent_entries += sent.numel()
    gathered = [torch.empty_like(payload) for _ in range(world)]
    work = dist.all_gather(gathered, payload, group=state.process_group, async_op=True)
    dense_bytes = dense_values.numel() * dense_values.element_size()
    index_end = dense_bytes + indices.numel() * INDEX_DTYPE.itemsize

    def decode(fut: torch.futures.Future) -> Tensor:
        total = torch.zeros_like(residual)
        for part in gathered:
            total.index_add_(0, layout.dense, part[:dense_bytes].view(residual.dtype))
            where = part[dense_bytes:index_end].view(INDEX_DTYPE).long()
            total.index_add_(0, where, part[index_end:].view(residual.dtype))
        if state.adam is not None:
            total.div_(rate)  # the optimizer multiplies by the rate again
        return total.div_(world).to(buffer.dtype)

    return _finish(work.get_future(), state, is_last, decode)


def _dense_adam(state: DGCState, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """One of `frozen_variance`'s dense steps: all-reduce the (locally clipped) gradient and
    return AdamW's direction of the mean, from moments every rank keeps alike."""
    buffer = bucket.buffer()
    current_layout(state, bucket)  # the moments are kept per bucket, moved on rebuilds
    grad = clip_locally(state, buffer.float() if buffer.dtype != torch.float64 else buffer)
    grad = grad.div(state.world_size())
    state.traffic.sent_bytes += buffer.numel() * buffer.element_size()
    state.traffic.sent_entries += buffer.numel()
    work = dist.all_reduce(grad, group=state.process_group, async_op=True)
    index = bucket.index()

    def direction(fut: torch.futures.Future) -> Tensor:
        return adam_direction(state, index, fut.value()[0]).to(buffer.dtype)

    return _finish(work.get_future(), state, bucket.is_last(), direction)


def _finish(
    future: torch.futures.Future, state: DGCState, is_last: bool, result
) -> torch.futures.Future[Tensor]:
    def done(fut: torch.futures.Future) -> Tensor:
        out = result(fut)
        if is_last:
            state.end_step()
        return out

    return future.then(done)


class CompressionMonitor(Callback):
    """Logs each optimizer step's traffic (`comm/sent_bytes`, `comm/dense_bytes`,
    `comm/compression`, `comm/sparsity`) and starts the warm-up where a resumed run
    left it."""

    def __init__(self, state: DGCState) -> None:
        self.state = state
        self._logged_step = -1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.state.step = trainer.global_step
        groups = trainer.optimizers[0].param_groups
        self.state.learning_rate = lambda: float(groups[0]["lr"])

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_) -> None:
        traffic = self.state.last_traffic
        if trainer.global_step == self._logged_step or traffic.entries == 0:
            return  # inside gradient accumulation, or before the first exchange
        self._logged_step = trainer.global_step
        values = {
            "comm/sent_bytes": float(traffic.sent_bytes),
            "comm/dense_bytes": float(traffic.dense_bytes),
            "comm/compression": traffic.compression,
            "comm/sparsity": 1.0 - traffic.sent_entries / max(traffic.entries, 1),
        }
        for name, value in values.items():
            pl_module.log(name, value, on_step=True, on_epoch=False, rank_zero_only=True)
