"""Checks between a training step's backward pass and its optimizer step, on which every
data-parallel rank agrees.

Each rank tallies what its micro-batches of one optimizer step saw (`StepTally`); one small
all-reduce turns the tallies into totals over all ranks (`StepTotals`), so every rank takes
the same decision and none is left waiting in a collective:

- the optimizer step is skipped when a loss or the gradient is not finite on any rank, and
  the run stops after `max_consecutive_nonfinite` such steps in a row (`NonFiniteGuard`);
- it is skipped when no rank had a usable utterance;
- the run stops when more than `max_skipped_fraction` of an epoch's cuts were unusable
  (`SkipBudget`): checked once `MIN_CUTS_MID_EPOCH` cuts have been seen, and at the end of
  the epoch; and at once when the run's first `FIRST_STEPS_ALL_UNUSABLE` optimizer steps
  had no usable cut, so that a wrong corpus path or tokenizer costs seconds, not an epoch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from asr.config_keys import dataclass_from_keys
from asr.data.batch import Batch
from asr.data.dataset import SKIP_REASONS
from asr.errors import InputFault
from asr.frames import FRAMES_PER_SECOND

MIN_CUTS_MID_EPOCH = 2000
# A run (fresh or resumed) stops when its first this many optimizer steps had no usable cut
# on any rank: a wrong directory or tokenizer, not a few bad files (which would have to fill
# every batch of these steps).
FIRST_STEPS_ALL_UNUSABLE = 3


class TrainingStopped(InputFault):
    """A fault that training cannot outrun; the message says what and what to do (`asr-train`
    ends on it with that one line and exit status 1)."""


@dataclass(frozen=True)
class FaultConfig:
    """Keys of the `faults` config.

    - `max_skipped_fraction`: stop when more than this fraction of an epoch's cuts was
      unusable (unreadable audio, impossible transcript); cuts the sampler filters by
      duration or tokens per second are not counted here.
    - `max_consecutive_nonfinite`: stop after this many optimizer steps in a row skipped
      because a loss or the gradient was NaN or infinite.
    """

    max_skipped_fraction: float = 0.05
    max_consecutive_nonfinite: int = 20

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any] | None) -> FaultConfig:
        out = dataclass_from_keys(cls, cfg, "faults")
        if not 0.0 <= out.max_skipped_fraction <= 1.0:
            raise ValueError(
                f"faults.max_skipped_fraction must be in [0, 1], got {out.max_skipped_fraction}"
            )
        if out.max_consecutive_nonfinite < 1:
            raise ValueError(
                "faults.max_consecutive_nonfinite must be >= 1, got "
                f"{out.max_consecutive_nonfinite}"
            )
        return out


@dataclass
class StepTally:
    """What this rank's micro-batches of one optimizer step saw."""

    utterances: int = 0
    audio_seconds: float = 0.0
    nonfinite_loss: bool = False
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> cuts
    cut_ids: list[str] = field(default_factory=list)
    first_fault: str = ""  # the first unusable cut and why

    def add(self, batch: Batch, loss: torch.Tensor | None) -> None:
        self.utterances += len(batch)
        self.first_fault = self.first_fault or batch.first_fault
        self.audio_seconds += float(batch.feature_lens.sum()) / FRAMES_PER_SECOND
        self.cut_ids += batch.cut_ids
        for reason, cut_ids in batch.skipped.items():
            self.skipped[reason] = self.skipped.get(reason, 0) + len(cut_ids)
        if loss is not None and not bool(torch.isfinite(loss.detach())):
            self.nonfinite_loss = True

    def vector(self, device: torch.device) -> torch.Tensor:
        """[non-finite flag, utterances, audio seconds, skipped cuts per reason]."""
        values = [float(self.nonfinite_loss), self.utterances, self.audio_seconds]
        values += [self.skipped.get(reason, 0) for reason in SKIP_REASONS]
        return torch.tensor(values, dtype=torch.float64, device=device)


@dataclass(frozen=True)
class StepTotals:
    """One optimizer step's tallies summed over all ranks."""

    nonfinite_ranks: int
    utterances: int
    audio_seconds: float
    skipped: dict[str, int]

    @classmethod
    def from_vector(cls, vector: torch.Tensor) -> StepTotals:
        v = vector.tolist()
        return cls(
            nonfinite_ranks=round(v[0]),
            utterances=round(v[1]),
            audio_seconds=v[2],
            skipped={reason: round(n) for reason, n in zip(SKIP_REASONS, v[3:], strict=True)},
        )


# The step group of a replica that steps alone (decentralized training): no reduction.
LOCAL = "local"


def sum_over_ranks(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """`tensor` summed over the processes of `group` (None: the default group; `LOCAL`:
    this process only), in place (unchanged in a single-process run). One all-reduce:
    Lightning's `strategy.reduce` adds a barrier."""
    if group == LOCAL:
        return tensor
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM, group=group)
    return tensor


def reduce_tally(tally: StepTally, device: torch.device, group: Any = None) -> StepTotals:
    """`tally` summed over the ranks that share the optimizer step (`group`, as in
    `sum_over_ranks`)."""
    return StepTotals.from_vector(sum_over_ranks(tally.vector(device), group))


def gradient_norm(parameters: Iterable[torch.nn.Parameter]) -> float:
    """The L2 norm of all gradients together (NaN or inf when any is not finite)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.nn.utils.get_total_norm(grads, norm_type=2.0))


class NonFiniteGuard:
    """Counts optimizer steps skipped for non-finite values; stops after too many in a row."""

    def __init__(self, max_consecutive: int) -> None:
        self.max_consecutive = max_consecutive
        self.total = 0
        self.consecutive = 0

    def record(self, nonfinite: bool, step: int, what: str) -> None:
        """Note one step; raise `TrainingStopped` at the `max_consecutive`-th bad step in a row."""
        if not nonfinite:
            self.consecutive = 0
            return
        self.total += 1
        self.consecutive += 1
        if self.consecutive >= self.max_consecutive:
            raise TrainingStopped(
                f"{self.consecutive} optimizer steps in a row had a non-finite loss or gradient "
                f"(the last at step {step}: {what}); none of them changed the weights, so the "
                "last checkpoint is good. Lower optim.lr, check the cut ids logged above, or "
                "raise faults.max_consecutive_nonfinite."
            )

    def state_dict(self) -> dict[str, int]:
        return {"total": self.total, "consecutive": self.consecutive}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.total, self.consecutive = state.get("total", 0), state.get("consecutive", 0)


class SkipBudget:
    """Cuts used and skipped in the current epoch over all ranks, against a limit.

    The counts of an unfinished epoch travel in checkpoints (`state_dict`), so that a run
    resumed inside an epoch judges the whole epoch, as an uninterrupted run does. They are
    totals over the ranks that share the optimizer step, the same on each of them."""

    def __init__(self, max_fraction: float) -> None:
        self.max_fraction = max_fraction
        self.start_epoch()
        # since this process started (not saved: a resumed run judges its own start)
        self.run_steps = 0
        self.run_used = 0
        self.run_skipped = 0
        self.first_fault = ""  # this rank's first unusable cut and why

    def start_epoch(self) -> None:
        self.used = 0
        self.skipped = dict.fromkeys(SKIP_REASONS, 0)
        self.epoch_ended = False

    def end_epoch(self) -> None:
        """The epoch's last check; a checkpoint written after it carries no counts (the next
        epoch starts from zero, whether or not Lightning calls its epoch-start hook on
        resume)."""
        self.epoch_ended = True
        self.check(epoch_end=True)

    def state_dict(self) -> dict[str, Any]:
        if self.epoch_ended:
            return {}
        return {"used": self.used, "skipped": dict(self.skipped)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.start_epoch()
        self.used = state.get("used", 0)
        self.skipped.update(state.get("skipped", {}))

    def add(self, totals: StepTotals, first_fault: str = "") -> None:
        """Count one step's totals; `first_fault` is this rank's first unusable cut in it."""
        self.used += totals.utterances
        for reason, n in totals.skipped.items():
            self.skipped[reason] += n
        self.run_steps += 1
        self.run_used += totals.utterances
        self.run_skipped += sum(totals.skipped.values())
        self.first_fault = self.first_fault or first_fault

    @property
    def seen(self) -> int:
        return self.used + sum(self.skipped.values())

    @property
    def fraction(self) -> float:
        return sum(self.skipped.values()) / self.seen if self.seen else 0.0

    def check(self, epoch_end: bool = False) -> None:
        """Raise `TrainingStopped` when too large a fraction was skipped (mid-epoch only
        once `MIN_CUTS_MID_EPOCH` cuts were seen, to judge on a fair sample)."""
        if self.run_used == 0 and self.run_steps >= FIRST_STEPS_ALL_UNUSABLE:
            first = f"; the first: {self.first_fault}" if self.first_fault else ""
            raise TrainingStopped(
                f"the first {self.run_skipped} cuts of this run ({self.run_steps} steps) were "
                f"all unusable{first}. "
                "Check the manifests' paths (relative ones are read from the working "
                "directory), the audio files and the tokenizer."
            )
        seen = self.seen
        if not epoch_end and seen < MIN_CUTS_MID_EPOCH:
            return
        if seen == 0 or self.fraction <= self.max_fraction:
            return
        commonest = max(self.skipped, key=self.skipped.get)
        raise TrainingStopped(
            f"{sum(self.skipped.values())} of the {seen} cuts seen this epoch "
            f"({100 * self.fraction:.1f} %) were unusable, more than "
            f"faults.max_skipped_fraction={self.max_fraction}; the commonest reason: "
            f"'{commonest}' ({self.skipped[commonest]} cuts). The warnings above name them: "
            "check the manifests, the audio files and the tokenizer."
        )
