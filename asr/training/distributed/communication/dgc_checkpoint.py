"""The DGC hook's per-rank state in checkpoints.

What waits in a rank's residual (up to ~1 / (1 - sparsity) steps of its updates), its
velocity or Adam moments, the hook's step and its sampling generator exist on that rank
only. Every rank writes its own file beside the resume checkpoint (`last.ckpt` ->
`last.dgc/rank{R}.pt`, atomically, per parameter name, on CPU), so a resumed run continues
with every residual, moment and step where the hook left them. (With `selection: bucket`
the first step after resuming takes its top-k over DDP's first-step buckets, which group
the parameters otherwise than its rebuilt ones, as every run's first step does: that step
may send other entries than an uninterrupted run would; nothing is lost.) Only `last.ckpt`
carries it: the per-epoch checkpoints are kept for averaging, and a copy of every rank's
state in each would multiply their size by up to 3 x the number of ranks (5 x with
AdamW's refreshes).

A run resumed from another checkpoint, with another number of processes, or from a file
that does not match the checkpoint's step starts the state at zero, with a warning that
says why (the updates still waiting are then lost; training goes on). With AdamW the
dense steps then begin again, to estimate a second moment.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import torch

from asr.training.checkpointing import RESUME_CHECKPOINT, save_atomically
from asr.training.distributed.communication.dgc_rebucketing import clear_buckets, per_parameter
from asr.training.distributed.communication.dgc_state import DGCState

log = logging.getLogger(__name__)

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
