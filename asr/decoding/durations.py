"""What a token-and-duration transducer's durations mean to a search, once.

A TDT joiner (`asr.models.transducer.Joiner` with `durations`; Xu et al. 2023, arXiv
2304.06795) gives V token logits, then one logit per duration. A search takes its tokens,
scores and confidences from the token part only (`split_logits`); the duration part says
how far it moves on after an emission at frame t, as NeMo's TDT decoding does:

- a blank with duration d moves to frame t + max(d, 1): a blank always moves on;
- a token with duration d is emitted and moves to t + d; with d = 0 it stays on t (the
  predictor has moved on), until `max_symbols_per_frame` tokens there move it to t + 1.

The frames in between are never visited: the speed-up. A plain transducer is the case
where every blank moves one frame and every token none. Greedy search takes the most
probable duration (`duration_table` turns its index into frames); beam search scores
token + duration log-probabilities and merges the durations that land on one frame
(`fold_landings`). Where a row goes next is part of its state between chunks
(`HypothesisState.skip`), so a duration that jumps past a chunk's end carries into the
next chunk.

Legend: R rows, V vocabulary, D durations.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def durations_of(model: Any) -> tuple[int, ...] | None:
    """A TDT model's durations, or None for a plain transducer (or a model that does not
    say, such as an ONNX export's)."""
    return getattr(model, "durations", None)


def split_logits(model: Any, logits: Tensor) -> tuple[Tensor, Tensor | None]:
    """The joiner's output (..., V [+ D]) -> (token logits (..., V), duration logits
    (..., D) or None for a plain transducer): views, no copy."""
    if durations_of(model) is None:
        return logits, None
    return model.joiner.split(logits)


def duration_table(model: Any, device: torch.device | str) -> Tensor | None:
    """(D,) the frames of each duration index (greedy search gathers its argmax from it),
    or None for a plain transducer."""
    durations = durations_of(model)
    if durations is None:
        return None
    return torch.tensor(durations, dtype=torch.long, device=device)


def landings(durations: tuple[int, ...], *, blank: bool, last_round: bool) -> list[int]:
    """The frames each duration moves an emission on: a blank at least one; a token at
    least one in the last round of a frame (`max_symbols_per_frame` reached), else its
    duration."""
    if blank or last_round:
        return [max(d, 1) for d in durations]
    return list(durations)


def fold_landings(log_probs: Tensor, moves: list[int]) -> tuple[Tensor, Tensor, list[int]]:
    """Duration log-probabilities (R, D) whose duration i moves `moves[i]` frames ->
    per distinct move, ascending: (R, M) the log-probability of the most probable duration
    that makes it, (R, M) that duration's index, and the M moves. Two durations that land
    on the same frame (a blank's 0 and 1) would put one hypothesis in two places of a
    beam; the most probable of them stands for both, as greedy search takes it."""
    distinct = sorted(set(moves))
    if len(distinct) == len(moves) and moves == distinct:
        index = torch.arange(len(moves), device=log_probs.device).expand_as(log_probs)
        return log_probs, index, moves
    columns, winners = [], []
    for move in distinct:
        at = torch.tensor([i for i, m in enumerate(moves) if m == move], device=log_probs.device)
        best, which = log_probs.index_select(-1, at).max(dim=-1)
        columns.append(best)
        winners.append(at[which])
    return torch.stack(columns, dim=-1), torch.stack(winners, dim=-1), distinct
