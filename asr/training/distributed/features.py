"""What `AsrLitModule` may ask of the run's distributed strategy. The strategies of this
project (`communication.hooked_ddp.HookedDDPStrategy`,
`communication.adpsgd.DecentralizedStrategy`)
implement `StrategyFeatures`; for Lightning's own strategies (one process, plain DDP)
`setup_distributed` hands the module `DENSE`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class StrategyFeatures(Protocol):
    """The questions the module asks of the distributed strategy, and nothing else."""

    def step_group(self) -> Any:
        """The ranks whose tallies decide an optimizer step together: None (every rank), a
        process group, or `asr.training.step_guard.LOCAL` (this rank alone)."""
        ...

    @property
    def moments_in_hook(self) -> bool:
        """The optimizer's moments live in a communication hook: it must run as plain SGD."""
        ...

    @property
    def sets_learning_rate(self) -> bool:
        """A callback sets each step's learning rate: no scheduler."""
        ...

    @property
    def clips_in_hook(self) -> bool:
        """Gradients are clipped per rank in a communication hook, not after the exchange."""
        ...


@dataclass(frozen=True)
class DenseFeatures:
    """Every rank decides each step, the optimizer keeps its moments, its scheduler sets the
    rate, Lightning clips: one process, or DDP's dense all-reduce."""

    moments_in_hook: bool = False
    sets_learning_rate: bool = False
    clips_in_hook: bool = False

    def step_group(self) -> Any:
        return None


DENSE = DenseFeatures()
