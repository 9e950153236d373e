"""Transducer decoding: batched greedy search and batched modified beam search.

Legend: B batch, K beam size, T frames, V vocabulary, D width. Call ``model.eval()``
first: decoding does not change the model's mode, and dropout would make the predictor
random.
"""

from __future__ import annotations

import math
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


@dataclass(frozen=True)
class BeamOptions:
    """beam_size: hypotheses kept per utterance; nbest: how many of them `beam_search`
    returns (best first)."""

    beam_size: int = 4
    nbest: int = 1

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {self.beam_size}")
        if not 1 <= self.nbest <= self.beam_size:
            raise ValueError(f"nbest must be in [1, beam_size={self.beam_size}], got {self.nbest}")


@dataclass(frozen=True)
class Hypothesis:
    """A token sequence (no blanks) and its log-probability, summed over the alignments
    that were merged into it."""

    tokens: tuple[int, ...]
    score: float


def _log_add(a: float, b: float) -> float:
    """log(exp(a) + exp(b)) of two finite log-probabilities."""
    high, low = max(a, b), min(a, b)
    return high + math.log1p(math.exp(low - high))


def _take(state: PredictorState, index: Tensor) -> PredictorState:
    """Rows `index` of a batch-first predictor state."""
    if isinstance(state, Tensor):
        return state.index_select(0, index)
    return tuple(_take(part, index) for part in state)


def _put(state: PredictorState, index: Tensor, rows: PredictorState) -> PredictorState:
    """`state` with its rows `index` replaced by `rows`."""
    if isinstance(state, Tensor):
        return state.index_copy(0, index, rows)
    return tuple(_put(s, index, r) for s, r in zip(state, rows, strict=True))


@torch.inference_mode()
def beam_search(
    model: Transducer,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    options: BeamOptions = BeamOptions(),
) -> list[list[Hypothesis]]:
    """Modified beam search (at most one non-blank token per frame), batched over the
    utterances: encoder_out (B, T, D_enc), encoder_lens (B,) -> per utterance its
    `options.nbest` best hypotheses, best first.

    Each utterance keeps K hypotheses in K rows of one (B x K) batch; empty rows score
    -inf. At each frame one joiner call scores every row's V extensions (blank keeps the
    tokens, any other token appends itself); each utterance keeps the K best of its K x V
    candidates, and candidates with the same tokens are merged into one whose score is the
    log-sum of theirs. The predictor runs once per frame for the rows that appended a
    token; the others keep their cached state and output. An utterance stops at its own
    length.
    """
    check_encoder_output(encoder_out, encoder_lens)
    predictor, joiner, blank = model.predictor, model.joiner, model.blank_id
    batch, device, k = encoder_out.size(0), encoder_out.device, options.beam_size
    if batch == 0:
        return []
    rows = batch * k
    enc = joiner.project_encoder(encoder_out)  # (B, T, D_joint)
    blanks = torch.full((rows,), blank, device=device, dtype=torch.long)
    pred_out, state = predictor.step(blanks, predictor.init_state(rows, device))
    pred = joiner.project_predictor(pred_out)  # (B*K, D_joint)
    scores = [[0.0] + [-math.inf] * (k - 1) for _ in range(batch)]  # per utterance and row
    tokens: list[list[tuple[int, ...]]] = [[()] * k for _ in range(batch)]
    lens = encoder_lens.tolist()
    for t in range(max(lens)):
        active = [t < n for n in lens]
        logits = joiner.joint(enc[:, t].repeat_interleave(k, dim=0), pred)  # (B*K, V)
        log_probs = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(-1)
        vocab = log_probs.size(-1)
        totals = torch.tensor(scores, device=device, dtype=log_probs.dtype).view(rows, 1)
        totals = totals + log_probs
        best, where = totals.view(batch, k * vocab).topk(min(k, k * vocab), dim=-1)
        best, where = best.tolist(), where.tolist()
        source = list(range(rows))  # the row each new row continues
        appended = [-1] * rows  # the token it appends (-1: none)
        for b in range(batch):
            if not active[b]:
                continue
            merged: dict[tuple[int, ...], list] = {}  # tokens -> [score, row, token]
            for score, flat in zip(best[b], where[b], strict=True):
                if score == -math.inf:
                    continue
                row, token = b * k + flat // vocab, flat % vocab
                seq = tokens[b][row - b * k]
                seq = seq if token == blank else (*seq, token)
                if seq in merged:
                    kept = merged[seq]
                    kept[0] = _log_add(kept[0], score)
                    if token == blank:  # a blank's state is cached: no predictor step
                        kept[1:] = [row, blank]
                else:
                    merged[seq] = [score, row, token]
            ranked = sorted(merged.items(), key=lambda item: -item[1][0])
            scores[b] = [entry[0] for _, entry in ranked] + [-math.inf] * (k - len(ranked))
            tokens[b] = [seq for seq, _ in ranked] + [()] * (k - len(ranked))
            for j, (_, (_, row, token)) in enumerate(ranked):
                source[b * k + j] = row
                appended[b * k + j] = -1 if token == blank else token
        index = torch.tensor(source, device=device)
        state, pred = _take(state, index), pred.index_select(0, index)
        emitting = [i for i, token in enumerate(appended) if token >= 0]
        if emitting:
            at = torch.tensor(emitting, device=device)
            last = torch.tensor([appended[i] for i in emitting], device=device)
            out, new_state = predictor.step(last, _take(state, at))
            state = _put(state, at, new_state)
            pred = pred.index_copy(0, at, joiner.project_predictor(out).to(pred.dtype))
    return [
        [
            Hypothesis(seq, score)
            for seq, score in zip(tokens[b], scores[b], strict=True)
            if score > -math.inf
        ][: options.nbest]
        for b in range(batch)
    ]
