"""The DGC hook's per-rank state (`DGCState`): residuals, velocity or Adam moments per DDP
bucket, the hook's step, its sampling generator and this step's traffic."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from asr.training.distributed.communication.dgc_config import AdamMoments, DGCConfig
from asr.training.distributed.communication.dgc_layout import BucketLayout
from asr.training.distributed.communication.dgc_traffic import StepTraffic

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
