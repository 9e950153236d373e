"""Which implementation computes the transducer lattice: `lattice = auto | torch | triton`.

Two implementations share one contract (`LatticeOps`: `node_scores_`, `lattice`,
`logit_grad_`, and `tdt_lattice` for the token-and-duration transducer): PyTorch ops
(`asr.losses.lattice`, any device, the reference) and Triton kernels
(`asr.losses.triton_lattice`, one launch per chunk or group, CUDA).

"auto" must never be the reason a run stops. On CUDA it is a `FallbackLattice`: the Triton
kernels, checked against the reference on a small random lattice the first time each
device is used, and given up for good, with one logged warning naming the cause, on a
disagreement or whenever a kernel fails to compile or launch. Any call counts, not only
the first: longer label sequences compile new kernel variants later in a run. The call
that failed is redone with the reference, so no batch is lost. Out-of-memory errors are
not failures of the kernels: they propagate, as they would from the reference. "triton"
fails loudly instead, and "torch" never tries the kernels.

What no fallback can catch: a kernel that launches and then faults the device (an illegal
memory access) leaves the CUDA context unusable. `scripts/gpu_check.py` runs the kernels
on a GPU against the reference for that reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

import torch
from torch import Tensor

from asr.config_keys import check_choice
from asr.errors import first_line
from asr.losses import lattice as torch_lattice
from asr.losses.lattice import GradientTerms, TdtGradientTerms, padded_labels

log = logging.getLogger(__name__)

LATTICE_IMPLEMENTATIONS = ("auto", "torch", "triton")
# The first-use check: a few samples of varied lengths (one without tokens), float32.
CHECK_FRAMES, CHECK_TOKENS, CHECK_VOCAB = (23, 16, 9, 1), (7, 3, 0, 2), 37
CHECK_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
# The TDT lattice's: durations with 0, a sample without tokens, one of a single frame.
CHECK_TDT_FRAMES, CHECK_TDT_TOKENS, CHECK_DURATIONS = (9, 5, 1), (4, 0, 2), (0, 1, 2, 3, 4)


class LatticeOps(Protocol):
    """The per-node work of the sample-wise loss; see `asr.losses.lattice` for each
    function's contract. Both implementation modules satisfy it."""

    def node_scores_(
        self,
        logits: Tensor,
        labels: Tensor,
        *,
        blank: int,
        lse: Tensor,
        z_blank: Tensor,
        z_label: Tensor,
    ) -> None: ...

    def lattice(
        self,
        lse: Tensor,
        z_blank: Tensor,
        z_label: Tensor,
        frames: Tensor,
        tokens: Tensor,
        *,
        gradient: bool,
    ) -> tuple[Tensor, GradientTerms | None]: ...

    def logit_grad_(
        self,
        logits: Tensor,
        labels: Tensor,
        terms: GradientTerms,
        *,
        blank: int,
        weights: Tensor | None = None,
        grad_clamp: float | None = None,
    ) -> Tensor: ...

    def tdt_lattice(
        self,
        lse: Tensor,
        z_blank: Tensor,
        z_label: Tensor,
        duration_lp: Tensor,
        frames: Tensor,
        tokens: Tensor,
        *,
        durations: tuple[int, ...],
        sigma: float = 0.0,
        gradient: bool,
    ) -> tuple[Tensor, TdtGradientTerms | None]: ...


def _import_triton_lattice() -> ModuleType:
    from asr.losses import triton_lattice  # imports triton: only when it is wanted

    return triton_lattice


def _is_out_of_memory(err: BaseException) -> bool:
    return isinstance(err, (torch.cuda.OutOfMemoryError, MemoryError))


def lattice_disagreement(fast: LatticeOps, reference: LatticeOps, device: torch.device) -> str:
    """Run both implementations on the same small random lattices on `device` (node
    scores, lattice with gradient terms, weighted logit gradient; the TDT lattice with its
    terms); "" when they agree, else what differs. Exceptions of `fast` propagate."""
    g = torch.Generator().manual_seed(0)
    samples, t, u1, vocab = len(CHECK_FRAMES), max(CHECK_FRAMES), max(CHECK_TOKENS) + 1, CHECK_VOCAB
    logits = (3 * torch.randn(samples, t, u1, vocab, generator=g)).to(device)
    targets = torch.randint(1, vocab, (samples, u1 - 1), generator=g).to(device)
    labels = padded_labels(targets, u1, blank=0, vocab=vocab)
    frames = torch.tensor(CHECK_FRAMES, device=device)
    tokens = torch.tensor(CHECK_TOKENS, device=device)
    weights = torch.linspace(0.5, 1.5, samples, device=device)
    results = []
    for ops in (fast, reference):
        z = logits.clone()
        lse, z_blank, z_label = z.new_empty((3, samples, t, u1)).unbind(0)
        ops.node_scores_(z.clone(), labels, blank=0, lse=lse, z_blank=z_blank, z_label=z_label)
        nll, terms = ops.lattice(lse, z_blank, z_label, frames, tokens, gradient=True)
        assert terms is not None
        grad = ops.logit_grad_(z, labels, terms, blank=0, weights=weights)
        results.append((nll, grad))
    names = ("loss", "logit gradient")
    return _first_difference(names, *results) or _tdt_disagreement(fast, reference, device, g)


def _tdt_disagreement(
    fast: LatticeOps, reference: LatticeOps, device: torch.device, g: torch.Generator
) -> str:
    """`lattice_disagreement` of the TDT lattices: loss and every gradient term."""
    samples, t, u1 = len(CHECK_TDT_FRAMES), max(CHECK_TDT_FRAMES), max(CHECK_TDT_TOKENS) + 1
    d = len(CHECK_DURATIONS)
    lse = (torch.rand(samples, t, u1, generator=g) + 2).to(device)
    z_blank, z_label = torch.randn(2, samples, t, u1, generator=g).to(device).unbind(0)
    duration_lp = torch.randn(samples, t, u1, d, generator=g).log_softmax(-1).to(device)
    frames = torch.tensor(CHECK_TDT_FRAMES, device=device)
    tokens = torch.tensor(CHECK_TDT_TOKENS, device=device)
    names = ("TDT loss", "TDT shift term", "TDT blank term", "TDT label term")
    names += ("TDT log occupancy", "TDT duration term")
    results = []
    for ops in (fast, reference):
        scores = (lse.clone(), z_blank.clone(), z_label.clone())
        nll, terms = ops.tdt_lattice(
            *scores,
            duration_lp,
            frames,
            tokens,
            durations=CHECK_DURATIONS,
            sigma=0.05,
            gradient=True,
        )
        assert terms is not None
        tok = terms.tokens
        results.append(
            (
                nll,
                tok.shift,
                tok.blank_move,
                tok.neg_label_move,
                terms.log_occupancy,
                terms.duration_moves,
            )
        )
    return _first_difference(names, *results)


def _first_difference(names: tuple[str, ...], got: tuple, want: tuple) -> str:
    """What differs: the first of `names` whose `got` is not close to its `want`, or ""."""
    for name, got_one, want_one in zip(names, got, want, strict=True):
        try:
            torch.testing.assert_close(got_one, want_one, **CHECK_TOLERANCE)
        except AssertionError as err:
            detail = first_line(err, with_type=False)
            return f"the {name} differs from the PyTorch reference ({detail})"
    return ""


class FallbackLattice:
    """`LatticeOps` that run a fast implementation (Triton's) until it fails or disagrees
    with the reference, then the reference for good (see the module docstring).

    `load_fast` returns the fast implementation (importing it may fail too); `check`
    compares it with `reference` on a small lattice the first time each device is used.
    `reason` is why the fast path was given up ("" while it runs); `active` names the
    implementation that runs now.
    """

    def __init__(
        self,
        load_fast: Callable[[], LatticeOps] = _import_triton_lattice,
        reference: LatticeOps = torch_lattice,
        *,
        check: bool = True,
        fast_name: str = "triton",
    ) -> None:
        self._load_fast = load_fast
        self._fast: LatticeOps | None = None
        self.reference = reference
        self.check = check
        self.fast_name = fast_name
        self.reason = ""
        self._checked: set[torch.device] = set()

    @property
    def active(self) -> str:
        return "torch" if self.reason else self.fast_name

    def give_up(self, reason: str) -> None:
        """Use the reference from now on; log one warning naming `reason`."""
        if self.reason:
            return
        self.reason = reason
        log.warning(
            "model.loss.lattice=auto: the %s lattice kernels are given up for the rest of this "
            "run, the PyTorch lattice takes over (same results, more kernel launches): %s. "
            "Set model.loss.lattice=torch to skip the attempt, or =triton to stop on it.",
            self.fast_name,
            reason,
        )

    def _ops_for(self, device: torch.device) -> LatticeOps:
        if not self.reason and self._fast is None:
            try:
                self._fast = self._load_fast()
            except Exception as err:
                self.give_up(f"loading it failed ({first_line(err)})")
        if not self.reason and self.check and device not in self._checked:
            self._checked.add(device)
            try:
                disagreement = lattice_disagreement(self._fast, self.reference, device)
            except Exception as err:
                if _is_out_of_memory(err):
                    raise
                disagreement = f"the first-use check failed ({first_line(err)})"
            if disagreement:
                self.give_up(disagreement)
        return self.reference if self.reason else self._fast

    def _call(self, name: str, device: torch.device, *args: Any, **kwargs: Any) -> Any:
        ops = self._ops_for(device)
        if ops is self.reference:
            return getattr(ops, name)(*args, **kwargs)
        try:
            return getattr(ops, name)(*args, **kwargs)
        except Exception as err:
            if _is_out_of_memory(err):
                raise
            self.give_up(f"{name} failed ({first_line(err)})")
        return getattr(self.reference, name)(*args, **kwargs)

    def node_scores_(self, logits: Tensor, labels: Tensor, **kwargs: Any) -> None:
        return self._call("node_scores_", logits.device, logits, labels, **kwargs)

    def lattice(
        self, lse: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, GradientTerms | None]:
        return self._call("lattice", lse.device, lse, *args, **kwargs)

    def logit_grad_(
        self, logits: Tensor, labels: Tensor, terms: GradientTerms, **kwargs: Any
    ) -> Tensor:
        return self._call("logit_grad_", logits.device, logits, labels, terms, **kwargs)

    def tdt_lattice(
        self, lse: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, TdtGradientTerms | None]:
        return self._call("tdt_lattice", lse.device, lse, *args, **kwargs)


# One per process: once given up, the kernels stay given up for every later loss call
# (training, validation, the batch-size search's probes).
AUTO_ON_CUDA = FallbackLattice()


def lattice_ops(choice: str | LatticeOps, device: torch.device) -> LatticeOps:
    """The implementation for `choice` on `device`: "torch" the reference; "triton" the
    kernels (an error where they cannot run); "auto" the kernels with the fallback on
    CUDA (`AUTO_ON_CUDA`) and the reference elsewhere. Anything else that is not a
    string is taken as a `LatticeOps` itself (a `FallbackLattice` of one's own, say)."""
    if not isinstance(choice, str):
        return choice
    check_choice("lattice", choice, LATTICE_IMPLEMENTATIONS)
    if choice == "torch" or (choice == "auto" and device.type != "cuda"):
        return torch_lattice
    if choice == "auto":
        return AUTO_ON_CUDA
    triton_lattice = _import_triton_lattice()
    if not triton_lattice.is_supported(device):
        raise RuntimeError(
            f"lattice='triton' cannot run on {device}: Triton kernels need a CUDA device "
            "(or, for testing, a machine without CUDA, where they run interpreted on the CPU)"
        )
    return triton_lattice


def active_lattice(choice: str | LatticeOps, device: torch.device) -> str:
    """What `choice` runs on `device` now: "torch", "triton", or for a `FallbackLattice`
    its active implementation, with the reason when it fell back."""
    ops = lattice_ops(choice, device)
    if isinstance(ops, FallbackLattice):
        return ops.active + (f" (fell back: {ops.reason})" if ops.reason else "")
    return "torch" if ops is torch_lattice else "triton"
