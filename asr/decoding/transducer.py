"""Transducer decoding: batched greedy search.

Legend: B batch, T frames, V vocabulary, D width. Call ``model.eval()`` first: decoding
does not change the model's mode, and dropout would make the predictor random.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from asr.decoding.checks import check_encoder_output
from asr.models.transducer import PredictorState, Transducer


@dataclass(frozen=True)
class GreedyOptions:
    """max_symbols_per_frame: at most this many non-blank tokens before moving to the next
    frame (a guard against a joiner that never emits blank)."""

    max_symbols_per_frame: int = 3


def _select(mask: Tensor, new: PredictorState, old: PredictorState) -> PredictorState:
    """Per sample (batch-first states): ``new`` where mask (B,) is True, else ``old``."""
    if isinstance(new, Tensor):
        return torch.where(mask.view(-1, *([1] * (new.dim() - 1))), new, old)
    return tuple(_select(mask, n, o) for n, o in zip(new, old, strict=True))


@torch.inference_mode()
def greedy_search(
    model: Transducer,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    options: GreedyOptions = GreedyOptions(),
) -> list[list[int]]:
    """encoder_out (B, T, D_enc), encoder_lens (B,) -> B token-id lists without blanks.

    One joiner call per (frame, symbol) step for the whole batch. A sample that emits a
    non-blank token advances its predictor and stays on the frame; the others keep their
    predictor state. Each sample stops at its own length.
    """
    if options.max_symbols_per_frame < 1:
        raise ValueError(f"max_symbols_per_frame must be >= 1, got {options.max_symbols_per_frame}")
    check_encoder_output(encoder_out, encoder_lens)
    predictor, joiner, blank = model.predictor, model.joiner, model.blank_id
    batch, device = encoder_out.size(0), encoder_out.device
    enc = joiner.project_encoder(encoder_out)  # (B, T, D_joint), all frames at once
    blanks = torch.full((batch,), blank, device=device, dtype=torch.long)
    pred_out, state = predictor.step(blanks, predictor.init_state(batch, device))
    pred = joiner.project_predictor(pred_out)  # (B, D_joint)
    emitted: list[Tensor] = []  # per step: token id, or -1 where nothing was emitted
    lens = encoder_lens.to(device)
    for t in range(int(lens.max()) if batch else 0):
        active = t < lens
        for _ in range(options.max_symbols_per_frame):
            tokens = joiner.joint(enc[:, t], pred).argmax(dim=-1)  # (B,)
            emit = active & (tokens != blank)
            if not bool(emit.any()):
                break
            emitted.append(torch.where(emit, tokens, -1))
            new_out, new_state = predictor.step(tokens, state)
            state = _select(emit, new_state, state)
            pred = torch.where(emit[:, None], joiner.project_predictor(new_out), pred)
            active = emit
    if not emitted:
        return [[] for _ in range(batch)]
    steps = torch.stack(emitted, dim=1).cpu()  # (B, steps)
    return [row[row >= 0].tolist() for row in steps]
