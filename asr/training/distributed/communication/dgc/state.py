"""What the DGC hook is configured with and keeps between steps, and how that state
follows DDP's buckets and survives a resumed run.

The configuration: the keys of `distributed.compression` (`DGCConfig`) and the AdamW
moments the hook takes over (`AdamMoments`). The per-rank state (`DGCState`): residuals,
velocity or Adam moments per DDP bucket, the hook's step, its sampling generator and this
step's traffic; `BucketLayout` says where each parameter lies in a bucket's flat buffer and
which entries the hook sends whole or by top-k.

Rebucketing: when DDP rebuilds its buckets (after the first step, in gradient-ready order)
or a checkpoint restores the state, the state waits per parameter (the stash) for the
bucket that will hold it; nothing waiting in a residual is lost.

Checkpoints: what waits in a rank's residual (up to ~1 / (1 - sparsity) steps of its
updates), its velocity or Adam moments, the hook's step and its sampling generator exist on
that rank only. Every rank writes its own file beside the resume checkpoint (`last.ckpt` ->
`last.dgc/rank{R}.pt`, atomically, per parameter name, on CPU), so a resumed run continues
with every residual, moment and step where the hook left them. (With `selection: bucket`
the first step after resuming takes its top-k over DDP's first-step buckets, which group
the parameters otherwise than its rebuilt ones, as every run's first step does: that step
may send other entries than an uninterrupted run would; nothing is lost.) Only `last.ckpt`
carries it: the per-epoch checkpoints are kept for averaging, and a copy of every rank's
state in each would multiply their size by up to 3 x the number of ranks (5 x with AdamW's
refreshes).

A run resumed from another checkpoint, with another number of processes, or from a file
that does not match the checkpoint's step starts the state at zero, with a warning that
says why (the updates still waiting are then lost; training goes on). With AdamW the
dense steps then begin again, to estimate a second moment.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from asr.config_keys import ConfigError, check_choice
from asr.training.checkpointing import RESUME_CHECKPOINT, save_atomically
from asr.training.distributed.communication.dgc.traffic import StepTraffic

log = logging.getLogger(__name__)

# The configuration: the keys of `distributed.compression`.

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
      `asr.training.distributed.communication.dgc.adam`).
    - `variance_refresh_steps`: with AdamW, the sparse steps between two refreshes of the
      frozen second moment from the ranks' local estimates (0: never; each costs 2 bytes
      per entry, spread over the steps between refreshes).
    - `selection`: `bucket` (one top-k over each DDP bucket: the largest entries wherever
      they are) or `tensor` (each parameter tensor sends its own share, at least one entry:
      the paper's layer-wise threshold).
    - `exchange`: `allgather` (every rank receives every rank's pairs: (W - 1) k per
      rank, growing with the ranks W) or `reduce_scatter` (each rank sums one region of
      the bucket and all-gathers its largest sums: about 2 (W - 1) / W x k per rank at
      any W; `asr.training.distributed.communication.dgc.hook`).
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


# The per-rank state.

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


def working_precision(grad: Tensor) -> Tensor:
    """`grad` in the precision the hook's state is kept in: float64 stays, others float32."""
    return grad if grad.dtype == torch.float64 else grad.float()


# Where each parameter lies in a bucket.


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


# Rebucketing: the state moved between DDP buckets.


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


def stash_all(state: DGCState) -> None:
    """Move every bucket's state to the per-parameter stash (DDP rebuilt its buckets)."""
    state.stash, state.stash_steps = per_parameter(state)
    clear_buckets(state)


def unstash(state: DGCState, index: int, layout: BucketLayout, like: Tensor) -> None:
    """Give bucket `index` (laid out as `layout`) the stashed state of its parameters;
    zeros where a parameter has none."""
    dtype = working_precision(like[:0]).dtype
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
        stash_all(state)
    layout = bucket_layout(params, state.config.dense_vectors, bucket.buffer().device)
    state.layouts[index] = layout
    unstash(state, index, layout, bucket.buffer())
    return layout


# Checkpoints: each rank's state beside `last.ckpt`.

RANK_STATE_FORMAT = 1


def rank_state_path(checkpoint: str | Path, rank: int) -> Path:
    """Where rank `rank` keeps its DGC state of `checkpoint` (`last.dgc/rank0.pt`)."""
    checkpoint = Path(checkpoint)
    return checkpoint.with_name(f"{checkpoint.stem}.dgc") / f"rank{rank}.pt"


def carries_rank_state(checkpoint: str | Path) -> bool:
    """Whether the DGC state is written beside `checkpoint` (the resume checkpoint only)."""
    return Path(checkpoint).name == RESUME_CHECKPOINT


def rank_state(
    state: DGCState, names: Mapping[int, str], global_step: int, rank: int, world_size: int
) -> dict:
    """This rank's hook state as a dict of CPU tensors per parameter name (`names`: the
    parameters' storage addresses to their names)."""
    tensors, steps = per_parameter(state)
    generator = state.generator.get_state() if state.generator is not None else None
    return {
        "format": RANK_STATE_FORMAT,
        "global_step": global_step,
        "rank": rank,
        "world_size": world_size,
        "hook_step": state.step,
        "dense_from": state.dense_from,
        "parameters": {
            names[ptr]: {kind: t.detach().to("cpu", copy=True) for kind, t in kinds.items()}
            for ptr, kinds in tensors.items()
            if ptr in names and kinds
        },
        "adam_steps": {names[ptr]: n for ptr, n in steps.items() if ptr in names},
        "generator": generator if generator is not None else state.generator_state,
    }


def save_rank_state(
    state: DGCState,
    names: Mapping[int, str],
    checkpoint: str | Path,
    global_step: int,
    rank: int,
    world_size: int,
) -> Path:
    """Write this rank's state beside `checkpoint`, atomically; its path."""
    path = rank_state_path(checkpoint, rank)
    save_atomically(rank_state(state, names, global_step, rank, world_size), path)
    return path


def restore_rank_state(state: DGCState, saved: dict, addresses: Mapping[str, int]) -> int:
    """Give `state` the saved state (`rank_state`'s dict): it waits in the stash for the
    buckets that will hold its parameters (`addresses`: names to storage addresses). The
    number of entries restored; a parameter the model does not have is an error."""
    unknown = sorted(set(saved["parameters"]) - set(addresses))
    if unknown:
        raise ValueError(
            f"the saved DGC state has parameters the model lacks: {', '.join(unknown[:5])}"
        )
    clear_buckets(state)
    state.stash = {addresses[n]: dict(kinds) for n, kinds in saved["parameters"].items()}
    state.stash_steps = {addresses[n]: int(t) for n, t in saved["adam_steps"].items()}
    state.step = int(saved["hook_step"])
    state.dense_from = int(saved.get("dense_from", 0))
    state.generator, state.generator_state = None, saved["generator"]
    return sum(t.numel() for kinds in saved["parameters"].values() for t in kinds.values())


def load_rank_state(
    state: DGCState,
    addresses: Mapping[str, int],
    checkpoint: str | Path,
    global_step: int,
    rank: int,
    world_size: int,
) -> bool:
    """Restore this rank's state written beside `checkpoint` when it matches the run
    (the checkpoint's `global_step`, the rank and the number of processes); otherwise log
    why the state starts at zero. Whether it was restored."""
    path = rank_state_path(checkpoint, rank)
    if not path.is_file():
        log.warning(
            "rank %d: no DGC state at %s (written beside %s only): the residuals, velocity "
            "and moments of the hook start at zero",
            rank,
            path,
            RESUME_CHECKPOINT,
        )
        return False
    saved = torch.load(path, map_location="cpu", weights_only=True)
    expected = {"format": RANK_STATE_FORMAT, "global_step": global_step, "world_size": world_size}
    wrong = {k: saved.get(k) for k, v in expected.items() if saved.get(k) != v}
    if wrong:
        log.warning(
            "rank %d: the DGC state at %s does not match this run (%s; expected %s): the "
            "hook's state starts at zero",
            rank,
            path,
            wrong,
            {k: expected[k] for k in wrong},
        )
        return False
    entries = restore_rank_state(state, saved, addresses)
    log.info("rank %d: restored the DGC state of %d entries from %s", rank, entries, path)
    return True
