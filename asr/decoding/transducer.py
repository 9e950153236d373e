"""Transducer decoding: batched greedy search and batched beam search (with one token per
frame: modified beam search).

Both are frame-synchronous, so each can stop after any frame and go on with the next
chunk of encoder output (streaming): `GreedyProgress` and `BeamProgress` hold a batch's
search between chunks, and rows of different streams can be stacked (`cat`) and taken
apart (`select`).

Both take an optional `ContextGraph` (`asr.decoding.biasing`): phrases whose tokens earn a
bonus, each hypothesis (or greedy row) carrying its state in the graph. Each emitted token
also gets a confidence from the distribution it was taken from (`asr.decoding.confidence`).

Legend: B batch, K beam size, T frames, V vocabulary, D width. Call ``model.eval()``
first: decoding does not change the model's mode, and dropout would make the predictor
random.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from asr.decoding.biasing import ContextGraph
from asr.decoding.checks import check_encoder_output
from asr.decoding.confidence import token_confidence
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


@dataclass(frozen=True)
class TimedTokens:
    """A hypothesis's token ids (no blanks), the encoder frame each was emitted at and
    the search's confidence in each (`asr.decoding.confidence`)."""

    tokens: list[int]
    frames: list[int]
    confidences: list[float]

    def __post_init__(self) -> None:
        if not len(self.tokens) == len(self.frames) == len(self.confidences):
            raise ValueError(
                f"{len(self.tokens)} tokens, {len(self.frames)} frames and "
                f"{len(self.confidences)} confidences"
            )


def greedy_search(
    model: Transducer,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    options: GreedyOptions = GreedyOptions(),
    context: ContextGraph | None = None,
) -> list[list[int]]:
    """encoder_out (B, T, D_enc), encoder_lens (B,) -> B token-id lists without blanks
    (`greedy_search_timed`'s tokens)."""
    hyps = greedy_search_timed(model, encoder_out, encoder_lens, options, context)
    return [hyp.tokens for hyp in hyps]


@torch.inference_mode()
def greedy_search_timed(
    model: Transducer,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    options: GreedyOptions = GreedyOptions(),
    context: ContextGraph | None = None,
) -> list[TimedTokens]:
    """encoder_out (B, T, D_enc), encoder_lens (B,) -> per utterance its tokens without
    blanks, the frame each was emitted at and its confidence (`greedy_continue` from the
    start)."""
    check_encoder_output(encoder_out, encoder_lens)
    progress = greedy_start(model, encoder_out.size(0), encoder_out.device)
    greedy_continue(model, progress, encoder_out, encoder_lens, options, context)
    return progress.results()


@dataclass
class GreedyProgress:
    """Greedy search of a batch between chunks: the projected predictor output
    (B, D_joint) and the predictor's state after each utterance's last token, its tokens,
    their frames and confidences, the frames it has consumed, and its state in the
    context graph (B,) (0 without one)."""

    pred: Tensor
    state: PredictorState
    tokens: list[list[int]]
    frames: list[list[int]]
    confidences: list[list[float]]
    consumed: list[int]
    nodes: Tensor

    def results(self) -> list[TimedTokens]:
        parts = zip(self.tokens, self.frames, self.confidences, strict=True)
        return [TimedTokens(list(t), list(f), list(c)) for t, f, c in parts]

    def select(self, index: list[int]) -> GreedyProgress:
        at = torch.tensor(index, device=self.pred.device)
        return GreedyProgress(
            self.pred.index_select(0, at),
            _take(self.state, at),
            [self.tokens[i] for i in index],
            [self.frames[i] for i in index],
            [self.confidences[i] for i in index],
            [self.consumed[i] for i in index],
            self.nodes.index_select(0, at),
        )

    @staticmethod
    def cat(parts: list[GreedyProgress]) -> GreedyProgress:
        return GreedyProgress(
            torch.cat([p.pred for p in parts]),
            _cat([p.state for p in parts]),
            [t for p in parts for t in p.tokens],
            [f for p in parts for f in p.frames],
            [c for p in parts for c in p.confidences],
            [c for p in parts for c in p.consumed],
            torch.cat([p.nodes for p in parts]),
        )


@torch.inference_mode()
def greedy_start(model: Transducer, batch: int, device: torch.device | str) -> GreedyProgress:
    """The greedy search of `batch` utterances before their first frame."""
    predictor, joiner = model.predictor, model.joiner
    blanks = torch.full((batch,), model.blank_id, device=device, dtype=torch.long)
    pred_out, state = predictor.step(blanks, predictor.init_state(batch, device))
    pred = joiner.project_predictor(pred_out)  # (B, D_joint)
    empty = [[] for _ in range(batch)]
    nodes = torch.zeros(batch, dtype=torch.long, device=device)
    return GreedyProgress(
        pred, state, empty, [[] for _ in empty], [[] for _ in empty], [0] * batch, nodes
    )


@torch.inference_mode()
def greedy_continue(
    model: Transducer,
    progress: GreedyProgress,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    options: GreedyOptions = GreedyOptions(),
    context: ContextGraph | None = None,
) -> None:
    """Search the next frames, encoder_out (B, T, D_enc) with encoder_lens (B,) valid,
    updating `progress` in place; token frames count from each utterance's start.

    One joiner call per (frame, symbol) step for the whole batch. A sample that emits a
    non-blank token advances its predictor and stays on the frame; the others keep their
    predictor state. Each sample stops at its own length. With `context`, each row picks
    the best of log P + what the token earns in the graph (`ContextGraph.advance`).
    """
    if options.max_symbols_per_frame < 1:
        raise ValueError(f"max_symbols_per_frame must be >= 1, got {options.max_symbols_per_frame}")
    predictor, joiner, blank = model.predictor, model.joiner, model.blank_id
    enc = joiner.project_encoder(encoder_out)  # (B, T, D_joint), all frames at once
    pred, state, nodes = progress.pred, progress.state, progress.nodes
    if context is not None:
        context = context.to(encoder_out.device)
    emitted: list[Tensor] = []  # per step: token id, or -1 where nothing was emitted
    confidences: list[Tensor] = []  # per step: the confidence of each row's choice
    step_frames: list[int] = []  # per step: its frame
    lens = encoder_lens.to(encoder_out.device)
    for t in range(int(lens.max()) if len(lens) else 0):
        active = t < lens
        for _ in range(options.max_symbols_per_frame):
            logits = joiner.joint(enc[:, t], pred)
            log_probs = logits.float().log_softmax(dim=-1)
            if context is None:
                tokens = logits.argmax(dim=-1)  # (B,)
            else:
                bonus = context.advance.index_select(0, nodes)
                bonus[:, blank] = 0.0
                tokens = (log_probs + bonus).argmax(dim=-1)
            emit = active & (tokens != blank)
            if not bool(emit.any()):
                break
            emitted.append(torch.where(emit, tokens, -1))
            confidences.append(token_confidence(log_probs))
            step_frames.append(t)
            new_out, new_state = predictor.step(tokens, state)
            state = _select(emit, new_state, state)
            pred = torch.where(emit[:, None], joiner.project_predictor(new_out), pred)
            if context is not None:
                nodes = torch.where(emit, context.next[nodes, tokens], nodes)
            active = emit
    progress.pred, progress.state, progress.nodes = pred, state, nodes
    if emitted:
        steps = torch.stack(emitted, dim=1).cpu()  # (B, steps)
        sureness = torch.stack(confidences, dim=1).cpu()
        frames = torch.tensor(step_frames)
        for b, row in enumerate(steps):
            kept = row >= 0
            progress.tokens[b] += row[kept].tolist()
            progress.frames[b] += (frames[kept] + progress.consumed[b]).tolist()
            progress.confidences[b] += sureness[b][kept].tolist()
    for b, n in enumerate(encoder_lens.tolist()):
        progress.consumed[b] += n


@dataclass(frozen=True)
class BeamOptions:
    """beam_size: hypotheses kept per utterance; max_symbols_per_frame: at most this many
    tokens per frame (1: icefall's modified beam search; the default matches greedy
    search's); nbest: how many hypotheses `beam_search` returns (best first)."""

    beam_size: int = 4
    max_symbols_per_frame: int = 3
    nbest: int = 1

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {self.beam_size}")
        if self.max_symbols_per_frame < 1:
            raise ValueError(
                f"max_symbols_per_frame must be >= 1, got {self.max_symbols_per_frame}"
            )
        if not 1 <= self.nbest <= self.beam_size:
            raise ValueError(f"nbest must be in [1, beam_size={self.beam_size}], got {self.nbest}")


@dataclass(frozen=True)
class Hypothesis:
    """A token sequence (no blanks), its log-probability summed over the alignments that
    were merged into it (plus its context bonus, where a graph was given), and the frame
    each token was emitted at and its confidence in the most probable of them."""

    tokens: tuple[int, ...]
    score: float
    frames: tuple[int, ...] = ()
    confidences: tuple[float, ...] = ()


def _log_add(a: float, b: float) -> float:
    """log(exp(a) + exp(b)) of two log-probabilities (not both -inf)."""
    high, low = max(a, b), min(a, b)
    return high + math.log1p(math.exp(low - high))


def _take(state: PredictorState, index: Tensor) -> PredictorState:
    """Rows `index` of a batch-first predictor state."""
    if isinstance(state, Tensor):
        return state.index_select(0, index)
    return tuple(_take(part, index) for part in state)


def _cat(states: list[PredictorState]) -> PredictorState:
    """Batch-first predictor states stacked along the batch."""
    if isinstance(states[0], Tensor):
        return torch.cat(states)
    return tuple(_cat([s[i] for s in states]) for i in range(len(states[0])))


def _put(state: PredictorState, index: Tensor, rows: PredictorState) -> PredictorState:
    """`state` with its rows `index` replaced by `rows`."""
    if isinstance(state, Tensor):
        return state.index_copy(0, index, rows)
    return tuple(_put(s, index, r) for s, r in zip(state, rows, strict=True))


# A candidate hypothesis of one round: [score, the row it continues, the token it appends
# (-1: none, its predictor state is that row's), its tokens' frames, the score of the
# alignment those frames come from, its tokens' confidences, the context bonus it would
# give back if the utterance ended here], keyed by its tokens.
Candidates = dict[tuple[int, ...], list]


def _add(
    candidates: Candidates,
    seq: tuple[int, ...],
    score: float,
    row: int,
    token: int,
    frames: tuple[int, ...],
    confidences: tuple[float, ...],
    held: float = 0.0,
) -> None:
    """Add a candidate; one with the same tokens is merged (scores log-added), keeping the
    row of one that needs no predictor step and the frames (and confidences) of the more
    probable."""
    kept = candidates.get(seq)
    if kept is None:
        candidates[seq] = [score, row, token, frames, score, confidences, held]
        return
    if score > kept[4]:
        kept[3:6] = [frames, score, confidences]
    kept[0] = _log_add(kept[0], score)
    if token < 0:
        kept[1:3] = [row, token]


@dataclass
class _Beam:
    """One utterance's K hypotheses (rows) during beam search: scores (-inf: an empty
    row), tokens, and whether each has ended the current frame."""

    scores: list[float]
    tokens: list[tuple[int, ...]]
    ended: list[bool]
    frames: list[tuple[int, ...]]
    confidences: list[tuple[float, ...]]

    @classmethod
    def start(cls, k: int) -> _Beam:
        return cls([0.0] + [-math.inf] * (k - 1), [()] * k, [True] * k, [()] * k, [()] * k)

    def start_frame(self, active: bool) -> None:
        """At a new frame every hypothesis is in it (none when the utterance has ended)."""
        self.ended = [not active or score == -math.inf for score in self.scores]

    def in_frame(self) -> list[int]:
        return [j for j, ended in enumerate(self.ended) if not ended]

    def advance(
        self,
        with_blank: list[float],
        best: list[float],
        where: list[int],
        vocab: int,
        last_round: bool,
        frame: int,
        confidence: list[float],
        held_rows: list[float],
        held_best: list[float],
    ) -> list[tuple[int, int]]:
        """Keep the K best of a round's candidates: the hypotheses that ended the frame,
        those in it ending it with blank (`with_blank`: each row's score so), and the
        best token extensions (`best`, `where`: their scores and row * vocab + token),
        which end the frame only in the last round; an appended token is at `frame`, with
        the `confidence` of its row's distribution. `held_rows`, `held_best`: the context
        bonus each row and each extension would give back if the utterance ended (see
        `_keep`). Per new row: (the row it continues, the token it appends or -1)."""
        done: Candidates = {}
        going: Candidates = {}
        for j, score in enumerate(self.scores):
            if self.ended[j] and score > -math.inf:
                sure = self.confidences[j]
                _add(done, self.tokens[j], score, j, -1, self.frames[j], sure, held_rows[j])
        for j in self.in_frame():
            sure, score = self.confidences[j], with_blank[j]
            _add(done, self.tokens[j], score, j, -1, self.frames[j], sure, held_rows[j])
        for score, flat, held in zip(best, where, held_best, strict=True):
            if score > -math.inf:
                row, token = divmod(flat, vocab)
                extended, frames = (*self.tokens[row], token), (*self.frames[row], frame)
                sure = (*self.confidences[row], confidence[row])
                into = done if last_round else going
                _add(into, extended, score, row, token, frames, sure, held)
        ranked = [(entry, seq, True) for seq, entry in done.items()]
        ranked += [(entry, seq, False) for seq, entry in going.items()]
        k = len(self.scores)
        ranked = _keep(ranked, k)
        empty = k - len(ranked)
        self.scores = [entry[0] for entry, _, _ in ranked] + [-math.inf] * empty
        self.tokens = [seq for _, seq, _ in ranked] + [()] * empty
        self.ended = [ended for _, _, ended in ranked] + [True] * empty
        self.frames = [entry[3] for entry, _, _ in ranked] + [()] * empty
        self.confidences = [entry[5] for entry, _, _ in ranked] + [()] * empty
        moves = [(entry[1], entry[2]) for entry, _, _ in ranked]
        return moves + [(j, -1) for j in range(len(ranked), k)]


def _keep(ranked: list[tuple[list, tuple[int, ...], bool]], k: int) -> list:
    """The K candidates a beam keeps: the best half by score, the rest by score without
    what a partial match of a context phrase holds (as if the utterance ended here). A
    hypothesis that earns a phrase's bonus token by token would otherwise crowd out the
    plain hypotheses, which must still be there when its match fails. Without a context
    graph both orders are the same: the K best."""
    by_score = sorted(ranked, key=lambda item: -item[0][0])
    half = (k + 1) // 2
    rest = sorted(by_score[half:], key=lambda item: -(item[0][0] - item[0][6]))
    return by_score[:half] + rest[: k - half]


@torch.inference_mode()
def beam_search(
    model: Transducer,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    options: BeamOptions = BeamOptions(),
    context: ContextGraph | None = None,
) -> list[list[Hypothesis]]:
    """Frame-synchronous beam search, batched over the utterances: encoder_out
    (B, T, D_enc), encoder_lens (B,) -> per utterance its `options.nbest` best hypotheses,
    best first (`beam_continue` from the start). With `max_symbols_per_frame` 1 it is
    icefall's modified beam search."""
    check_encoder_output(encoder_out, encoder_lens)
    if encoder_out.size(0) == 0:
        return []
    progress = beam_start(model, encoder_out.size(0), options.beam_size, encoder_out.device)
    beam_continue(model, progress, encoder_out, encoder_lens, options, context)
    return progress.hypotheses(options.nbest)


@dataclass
class BeamProgress:
    """Beam search of a batch between chunks: per utterance its `_Beam` of K rows, the
    predictor's state and projected output of every row (B * K first), the frames it
    has consumed, each row's state in the context graph (0 without one) and the bonus it
    would give back if the utterance ended now (`held`)."""

    beams: list[_Beam]
    state: PredictorState
    pred: Tensor
    consumed: list[int]
    nodes: Tensor
    held: list[float]

    @property
    def beam_size(self) -> int:
        return len(self.beams[0].scores) if self.beams else 0

    def hypotheses(self, nbest: int) -> list[list[Hypothesis]]:
        """Per utterance its `nbest` best hypotheses so far, best first, scored as if the
        utterance ended here (a partial match of a context phrase gives its bonus back)."""
        k = self.beam_size
        results = []
        for b, beam in enumerate(self.beams):
            rows = zip(
                beam.tokens,
                beam.scores,
                beam.frames,
                beam.confidences,
                self.held[b * k : b * k + k],
                strict=True,
            )
            hyps = [
                Hypothesis(seq, score - held, frames, sure)
                for seq, score, frames, sure, held in rows
                if score > -math.inf
            ]
            results.append(sorted(hyps, key=lambda h: -h.score)[:nbest])
        return results

    def select(self, index: list[int]) -> BeamProgress:
        k = self.beam_size
        rows = [i * k + j for i in index for j in range(k)]
        at = torch.tensor(rows, device=self.pred.device)
        return BeamProgress(
            [copy.deepcopy(self.beams[i]) for i in index],
            _take(self.state, at),
            self.pred.index_select(0, at),
            [self.consumed[i] for i in index],
            self.nodes.index_select(0, at),
            [self.held[r] for r in rows],
        )

    @staticmethod
    def cat(parts: list[BeamProgress]) -> BeamProgress:
        return BeamProgress(
            [b for p in parts for b in p.beams],
            _cat([p.state for p in parts]),
            torch.cat([p.pred for p in parts]),
            [c for p in parts for c in p.consumed],
            torch.cat([p.nodes for p in parts]),
            [h for p in parts for h in p.held],
        )


@dataclass
class _Round:
    """A round's candidates (see `_Beam.advance`): per row its score with blank, its
    confidence and what it would give back; per utterance its best extensions' scores,
    places (row * vocab + token) and what each would give back."""

    with_blank: list[float]
    confidence: list[float]
    held_rows: list[float]
    best: list[list[float]]
    where: list[list[int]]
    held_best: list[list[float]]
    vocab: int


def _score_round(
    logits: Tensor,
    beams: list[_Beam],
    live: list[int],
    nodes: Tensor,
    context: ContextGraph | None,
    blank: int,
) -> _Round:
    """Score the V extensions of the rows `live` (B*K logits): each hypothesis's score +
    log P (+ the token's gain in `context`, blank none), the K best per utterance (with a
    context graph, also the K best as if every partial match ended: `_keep`)."""
    k = len(beams[0].scores)
    batch, device = len(beams), logits.device
    log_probs = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(dim=-1)
    vocab = log_probs.size(-1)
    scores = [score for beam in beams for score in beam.scores]
    totals = torch.full_like(log_probs, -math.inf)
    at = torch.tensor(live, device=device)
    base = torch.tensor(scores, device=device, dtype=log_probs.dtype)[at, None]
    totals[at] = base + log_probs[at]
    held_rows = [0.0] * (batch * k)
    if context is not None:
        bonus = context.gain.index_select(0, nodes[at])
        bonus[:, blank] = 0.0
        totals[at] += bonus
        held_rows = context.held[nodes].tolist()
    confidence = token_confidence(log_probs).tolist()
    with_blank = totals[:, blank].tolist()
    totals[:, blank] = -math.inf
    best, where = totals.view(batch, k * vocab).topk(k, dim=-1)
    if context is None:
        held_best = [[0.0] * k for _ in range(batch)]
        return _Round(
            with_blank, confidence, held_rows, best.tolist(), where.tolist(), held_best, vocab
        )
    best_, where_, held_best = _with_plain_best(totals, where, context, nodes, k)
    return _Round(with_blank, confidence, held_rows, best_, where_, held_best, vocab)


def _with_plain_best(
    totals: Tensor, where: Tensor, context: ContextGraph, nodes: Tensor, k: int
) -> tuple[list[list[float]], list[list[int]], list[list[float]]]:
    """Per utterance the token extensions of `where` (the K best by score) and the K best
    by score less the bonus their state would give back (`ContextGraph.held`), without
    repeats: (scores, row * vocab + token, what each would give back)."""
    batch, vocab = totals.size(0) // k, totals.size(1)
    held = context.held[context.next[nodes]]  # (B*K, V)
    plain = (totals - held).view(batch, k * vocab).topk(k, dim=-1).indices
    flat = torch.cat([where, plain], dim=1)
    scores = totals.view(batch, -1).gather(1, flat).tolist()
    gives = held.view(batch, -1).gather(1, flat).tolist()
    best, at, back = [], [], []
    for row_scores, row_flat, row_gives in zip(scores, flat.tolist(), gives, strict=True):
        seen = dict.fromkeys(row_flat)  # in order, without repeats
        keep = [row_flat.index(f) for f in seen]
        best.append([row_scores[i] for i in keep])
        at.append(list(seen))
        back.append([row_gives[i] for i in keep])
    return best, at, back


@torch.inference_mode()
def beam_start(model: Transducer, batch: int, k: int, device: torch.device | str) -> BeamProgress:
    """The beam search of `batch` utterances, `k` hypotheses each, before their first frame."""
    predictor, joiner = model.predictor, model.joiner
    blanks = torch.full((batch * k,), model.blank_id, device=device, dtype=torch.long)
    pred_out, state = predictor.step(blanks, predictor.init_state(batch * k, device))
    pred = joiner.project_predictor(pred_out)  # (B*K, D_joint)
    nodes = torch.zeros(batch * k, dtype=torch.long, device=device)
    beams = [_Beam.start(k) for _ in range(batch)]
    return BeamProgress(beams, state, pred, [0] * batch, nodes, [0.0] * (batch * k))


@torch.inference_mode()
def beam_continue(
    model: Transducer,
    progress: BeamProgress,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    options: BeamOptions = BeamOptions(),
    context: ContextGraph | None = None,
) -> None:
    """Search the next frames, encoder_out (B, T, D_enc) with encoder_lens (B,) valid,
    updating `progress` in place; token frames count from each utterance's start.

    Each utterance keeps K hypotheses in K rows of one (B x K) batch; empty rows score
    -inf. A frame takes up to S = `max_symbols_per_frame` rounds. In each, one joiner call
    scores the V extensions of every hypothesis still in the frame: blank ends the frame
    with the tokens unchanged; a token is appended, and the hypothesis stays in the frame
    for another round, except in round S, where the token ends it (as greedy search moves
    on after S tokens). Each utterance keeps the K best of the hypotheses that ended the
    frame and those still in it; candidates with the same tokens and the same place are
    merged into one whose score is the log-sum of theirs. The predictor runs once per
    appended token; the other hypotheses keep their cached state and output. With K = 1
    this is greedy search. An utterance stops at its own length.

    With `context`, a token extension scores log P + its gain in the graph
    (`ContextGraph.gain`: the bonus it earns, or gives back when it breaks a partial
    match), blank none; `hypotheses` gives back what a partial match still holds.
    """
    predictor, joiner, blank = model.predictor, model.joiner, model.blank_id
    beams, state, pred, nodes = progress.beams, progress.state, progress.pred, progress.nodes
    if context is not None:
        context = context.to(encoder_out.device)
    batch, device, k = encoder_out.size(0), encoder_out.device, progress.beam_size
    if k != options.beam_size:
        raise ValueError(f"the search was started with beam size {k}, not {options.beam_size}")
    rows = batch * k
    enc = joiner.project_encoder(encoder_out)  # (B, T, D_joint)
    lens = encoder_lens.tolist()
    for t in range(max(lens, default=0)):
        enc_t = enc[:, t].repeat_interleave(k, dim=0)
        for b, beam in enumerate(beams):
            beam.start_frame(active=t < lens[b])
        for round_ in range(1, options.max_symbols_per_frame + 1):
            live = [b * k + j for b, beam in enumerate(beams) for j in beam.in_frame()]
            if not live:
                break
            logits = joiner.joint(enc_t, pred)  # (B*K, V)
            found = _score_round(logits, beams, live, nodes, context, blank)
            source = list(range(rows))  # the row each new row continues
            appended = [-1] * rows  # the token it appends (-1: none)
            last_round = round_ == options.max_symbols_per_frame
            for b, beam in enumerate(beams):
                if not beam.in_frame():
                    continue
                rows_b = slice(b * k, (b + 1) * k)
                frame = progress.consumed[b] + t
                moves = beam.advance(
                    found.with_blank[rows_b],
                    found.best[b],
                    found.where[b],
                    found.vocab,
                    last_round,
                    frame,
                    found.confidence[rows_b],
                    found.held_rows[rows_b],
                    found.held_best[b],
                )
                for j, (row, token) in enumerate(moves):
                    source[b * k + j], appended[b * k + j] = b * k + row, token
            index = torch.tensor(source, device=device)
            state, pred = _take(state, index), pred.index_select(0, index)
            nodes = nodes.index_select(0, index)
            emitting = [i for i, token in enumerate(appended) if token >= 0]
            if emitting:
                at = torch.tensor(emitting, device=device)
                last = torch.tensor([appended[i] for i in emitting], device=device)
                if context is not None:
                    nodes = nodes.index_copy(0, at, context.next[nodes[at], last])
                out, new_state = predictor.step(last, _take(state, at))
                state = _put(state, at, new_state)
                pred = pred.index_copy(0, at, joiner.project_predictor(out).to(pred.dtype))
    progress.state, progress.pred, progress.nodes = state, pred, nodes
    if context is not None:
        progress.held = context.held[nodes].tolist()
    for b, n in enumerate(lens):
        progress.consumed[b] += n
