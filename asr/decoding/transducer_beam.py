"""Transducer beam search (with one token per frame: icefall's modified beam search), batched
over the utterances, behind the search contract (`asr.decoding.search`).

It is frame-synchronous, so it can stop after any frame and go on with the next chunk of
encoder output (streaming): `BeamProgress` holds a batch's search between chunks, and rows
of different streams can be stacked (`cat`) and taken apart (`select`).

A biasing graph (`asr.decoding.biasing`, given to `start`) adds what each token earns to
its extension's score; each hypothesis carries its state in the graph. Each emitted token
gets a confidence from the distribution it was taken from (`asr.decoding.confidence`).

Legend: B batch, K beam size, T frames, V vocabulary, D width. Call ``model.eval()``
first: decoding does not change the model's mode, and dropout would make the predictor
random.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from asr.decoding.biasing import BiasingGraph, keep_half
from asr.decoding.checks import check_beam, check_encoder_output, check_same_biasing
from asr.decoding.confidence import token_confidence
from asr.decoding.hypotheses import Hypothesis, HypothesisState, TimedTokens
from asr.models.transducer import Transducer


@dataclass(frozen=True)
class BeamOptions:
    """beam_size: hypotheses kept per utterance; max_symbols_per_frame: at most this many
    tokens per frame (1: icefall's modified beam search; the default matches greedy
    search's); nbest: how many hypotheses an n-best list holds (best first)."""

    beam_size: int = 4
    max_symbols_per_frame: int = 3
    nbest: int = 1

    def __post_init__(self) -> None:
        check_beam(self.beam_size, self.nbest)
        if self.max_symbols_per_frame < 1:
            raise ValueError(
                f"max_symbols_per_frame must be >= 1, got {self.max_symbols_per_frame}"
            )


def _log_add(a: float, b: float) -> float:
    """log(exp(a) + exp(b)) of two log-probabilities (not both -inf)."""
    high, low = max(a, b), min(a, b)
    return high + math.log1p(math.exp(low - high))


@dataclass(slots=True)
class _Candidate:
    """A hypothesis a round may keep: its `tokens`, its `score` (log-added over the
    alignments merged into it), the `row` it continues and the `token` it appends (-1:
    none, its state is that row's), its tokens' `frames` and `confidences` in the most
    probable of those alignments and that alignment's score (`alignment_score`), the
    biasing bonus it would give back if the utterance ended here (`held`), and whether it
    has ended the frame (`ended`)."""

    tokens: tuple[int, ...]
    score: float
    row: int
    token: int
    frames: tuple[int, ...]
    confidences: tuple[float, ...]
    held: float
    ended: bool
    alignment_score: float = -math.inf

    def __post_init__(self) -> None:
        self.alignment_score = self.score

    def merge(self, other: _Candidate) -> None:
        """Take in `other`, an alignment of the same tokens: the scores log-added, the
        frames (and confidences) of the more probable alignment, the row of one that
        needs no predictor step."""
        if other.score > self.alignment_score:
            self.frames, self.confidences = other.frames, other.confidences
            self.alignment_score = other.score
        self.score = _log_add(self.score, other.score)
        if other.token < 0:
            self.row, self.token = other.row, other.token


def _add(candidates: dict[tuple[int, ...], _Candidate], candidate: _Candidate) -> None:
    """Add `candidate`, merged into one with the same tokens if there is one."""
    kept = candidates.get(candidate.tokens)
    if kept is None:
        candidates[candidate.tokens] = candidate
    else:
        kept.merge(candidate)


@dataclass
class _Round:
    """A round's candidates, scored for every row of the batch (B*K first): per row its
    score with blank (ending the frame), its confidence and what it would give back; per
    utterance its best extensions' scores, places (row * vocab + token) and what each
    would give back."""

    with_blank: list[float]
    confidence: list[float]
    held_rows: list[float]
    best: list[list[float]]
    where: list[list[int]]
    held_best: list[list[float]]
    vocab: int


@dataclass
class _Beam:
    """One utterance's K hypotheses (rows) during beam search: scores (-inf: an empty
    row), tokens, whether each has ended the current frame, frames and confidences."""

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
        self, found: _Round, utterance: int, frame: int, last_round: bool
    ) -> list[tuple[int, int]]:
        """Keep the K best of a round's candidates for this beam (`utterance` of the
        batch): the hypotheses that ended the frame, those in it ending it with blank, and
        the best token extensions, which end the frame only in the last round; an appended
        token is at `frame`, with the confidence of its row's distribution. Per new row:
        (the row it continues, the token it appends or -1)."""
        k = len(self.scores)
        first = utterance * k
        done: dict[tuple[int, ...], _Candidate] = {}
        going: dict[tuple[int, ...], _Candidate] = {}
        for j, score in enumerate(self.scores):
            if self.ended[j] and score > -math.inf:
                _add(done, self._kept(j, score, found.held_rows[first + j]))
        for j in self.in_frame():
            _add(done, self._kept(j, found.with_blank[first + j], found.held_rows[first + j]))
        extensions = zip(
            found.best[utterance], found.where[utterance], found.held_best[utterance], strict=True
        )
        for score, flat, held in extensions:
            if score > -math.inf:
                row, token = divmod(flat, found.vocab)
                _add(
                    done if last_round else going,
                    _Candidate(
                        (*self.tokens[row], token),
                        score,
                        row,
                        token,
                        (*self.frames[row], frame),
                        (*self.confidences[row], found.confidence[first + row]),
                        held,
                        ended=last_round,
                    ),
                )
        ranked = [*done.values(), *going.values()]
        by_score = sorted(range(len(ranked)), key=lambda i: -ranked[i].score)
        by_plain = sorted(by_score, key=lambda i: -(ranked[i].score - ranked[i].held))
        kept = [ranked[i] for i in keep_half(by_score, by_plain, k)]
        empty = k - len(kept)
        self.scores = [c.score for c in kept] + [-math.inf] * empty
        self.tokens = [c.tokens for c in kept] + [()] * empty
        self.ended = [c.ended for c in kept] + [True] * empty
        self.frames = [c.frames for c in kept] + [()] * empty
        self.confidences = [c.confidences for c in kept] + [()] * empty
        moves = [(c.row, c.token) for c in kept]
        return moves + [(j, -1) for j in range(len(kept), k)]

    def _kept(self, j: int, score: float, held: float) -> _Candidate:
        """Row j's hypothesis as it is, ending the frame with `score`."""
        return _Candidate(
            self.tokens[j], score, j, -1, self.frames[j], self.confidences[j], held, ended=True
        )


@dataclass(frozen=True)
class BeamProgress:
    """Beam search of a batch between chunks: per utterance its `_Beam` of K rows, every
    row's state (B * K rows, `HypothesisState`), the biasing graph (None: none) and the
    frames each utterance has consumed (`first_frame` of `start` included)."""

    beams: list[_Beam]
    rows: HypothesisState
    biasing: BiasingGraph | None
    consumed: list[int]

    @property
    def beam_size(self) -> int:
        return len(self.beams[0].scores) if self.beams else 0

    def nbest(self, n: int) -> list[list[Hypothesis]]:
        """Per utterance its `n` best hypotheses so far, best first, scored as if the
        utterance ended here (a partial match of a biasing phrase gives its bonus back)."""
        k = self.beam_size
        held = [0.0] * (len(self.beams) * k)
        if self.biasing is not None:
            held = self.biasing.held[self.rows.biasing_node].tolist()
        results = []
        for b, beam in enumerate(self.beams):
            rows = zip(
                beam.tokens,
                beam.scores,
                beam.frames,
                beam.confidences,
                held[b * k : b * k + k],
                strict=True,
            )
            hyps = [
                Hypothesis(seq, score - held, frames, sure)
                for seq, score, frames, sure, held in rows
                if score > -math.inf
            ]
            results.append(sorted(hyps, key=lambda h: -h.score)[:n])
        return results

    def select(self, index: list[int]) -> BeamProgress:
        k = self.beam_size
        rows = [i * k + j for i in index for j in range(k)]
        at = torch.tensor(rows, device=self.rows.pred.device)
        return BeamProgress(
            [copy.deepcopy(self.beams[i]) for i in index],
            self.rows.take(at),
            self.biasing,
            [self.consumed[i] for i in index],
        )

    @staticmethod
    def cat(parts: list[BeamProgress]) -> BeamProgress:
        return BeamProgress(
            [b for p in parts for b in p.beams],
            HypothesisState.cat([p.rows for p in parts]),
            check_same_biasing([p.biasing for p in parts]),
            [c for p in parts for c in p.consumed],
        )


def _score_round(
    logits: Tensor,
    beams: list[_Beam],
    live: list[int],
    nodes: Tensor,
    biasing: BiasingGraph | None,
    blank: int,
) -> _Round:
    """Score the V extensions of the rows `live` (B*K logits): each hypothesis's score +
    log P (+ the token's gain in `biasing`, blank none), the K best per utterance (with a
    biasing graph, also the K best as if every partial match ended: `keep_half`)."""
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
    if biasing is not None:
        bonus = biasing.gain.index_select(0, nodes[at])
        bonus[:, blank] = 0.0
        totals[at] += bonus
        held_rows = biasing.held[nodes].tolist()
    confidence = token_confidence(log_probs).tolist()
    with_blank = totals[:, blank].tolist()
    totals[:, blank] = -math.inf
    best, where = totals.view(batch, k * vocab).topk(k, dim=-1)
    if biasing is None:
        held_best = [[0.0] * k for _ in range(batch)]
        return _Round(
            with_blank, confidence, held_rows, best.tolist(), where.tolist(), held_best, vocab
        )
    best_, where_, held_best = _with_plain_best(totals, where, biasing, nodes, k)
    return _Round(with_blank, confidence, held_rows, best_, where_, held_best, vocab)


def _with_plain_best(
    totals: Tensor, where: Tensor, biasing: BiasingGraph, nodes: Tensor, k: int
) -> tuple[list[list[float]], list[list[int]], list[list[float]]]:
    """Per utterance the token extensions of `where` (the K best by score) and the K best
    by score less the bonus their state would give back (`BiasingGraph.held`), without
    repeats: (scores, row * vocab + token, what each would give back)."""
    batch, vocab = totals.size(0) // k, totals.size(1)
    held = biasing.held[biasing.next[nodes]]  # (B*K, V)
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


class BeamSearch:
    """Frame-synchronous beam search of `options.beam_size` hypotheses per utterance.

    Each utterance keeps K hypotheses in K rows of one (B x K) batch; empty rows score
    -inf. A frame takes up to S = `max_symbols_per_frame` rounds. In each, one joiner call
    scores the V extensions of every hypothesis still in the frame: blank ends the frame
    with the tokens unchanged; a token is appended, and the hypothesis stays in the frame
    for another round, except in round S, where the token ends it (as greedy search moves
    on after S tokens). Each utterance keeps the K best of the hypotheses that ended the
    frame and those still in it; candidates with the same tokens and the same place are
    merged into one whose score is the log-sum of theirs. The predictor runs once per
    appended token; the other hypotheses keep their cached state and output. With K = 1
    this is greedy search; with S = 1, icefall's modified beam search. An utterance stops
    at its own length.

    With a biasing graph, a token extension scores log P + its gain in the graph
    (`BiasingGraph.gain`: the bonus it earns, or gives back when it breaks a partial
    match), blank none; `nbest` gives back what a partial match still holds.
    """

    def __init__(self, options: BeamOptions = BeamOptions()) -> None:
        self.options = options

    def start(
        self,
        model: Transducer,
        batch_size: int,
        device: torch.device | str,
        biasing: BiasingGraph | None = None,
        first_frame: int = 0,
    ) -> BeamProgress:
        k = self.options.beam_size
        return BeamProgress(
            [_Beam.start(k) for _ in range(batch_size)],
            HypothesisState.start(model, batch_size * k, device),
            None if biasing is None else biasing.to(device),
            [first_frame] * batch_size,
        )

    @torch.inference_mode()
    def advance(
        self, model: Transducer, progress: BeamProgress, encoder_out: Tensor, encoder_lens: Tensor
    ) -> BeamProgress:
        """The search after the next frames, encoder_out (B, T, D_enc) with encoder_lens
        (B,) valid."""
        check_encoder_output(encoder_out, encoder_lens)
        joiner, blank, biasing = model.joiner, model.blank_id, progress.biasing
        biasing_next = None if biasing is None else biasing.next
        beams = [dataclasses.replace(beam) for beam in progress.beams]
        rows_state = progress.rows
        batch, device, k = encoder_out.size(0), encoder_out.device, progress.beam_size
        if k != self.options.beam_size:
            raise ValueError(
                f"the search was started with beam size {k}, not {self.options.beam_size}"
            )
        rows = batch * k
        enc = joiner.project_encoder(encoder_out)  # (B, T, D_joint)
        lens = encoder_lens.tolist()
        for t in range(max(lens, default=0)):
            enc_t = enc[:, t].repeat_interleave(k, dim=0)
            for b, beam in enumerate(beams):
                beam.start_frame(active=t < lens[b])
            for round_ in range(1, self.options.max_symbols_per_frame + 1):
                live = [b * k + j for b, beam in enumerate(beams) for j in beam.in_frame()]
                if not live:
                    break
                logits = joiner.joint(enc_t, rows_state.pred)  # (B*K, V)
                found = _score_round(logits, beams, live, rows_state.biasing_node, biasing, blank)
                source = list(range(rows))  # the row each new row continues
                appended = [-1] * rows  # the token it appends (-1: none)
                last_round = round_ == self.options.max_symbols_per_frame
                for b, beam in enumerate(beams):
                    if not beam.in_frame():
                        continue
                    frame = progress.consumed[b] + t
                    for j, (row, token) in enumerate(beam.advance(found, b, frame, last_round)):
                        source[b * k + j], appended[b * k + j] = b * k + row, token
                rows_state = rows_state.take(torch.tensor(source, device=device))
                emitting = [i for i, token in enumerate(appended) if token >= 0]
                if emitting:
                    at = torch.tensor(emitting, device=device)
                    last = torch.tensor([appended[i] for i in emitting], device=device)
                    rows_state = rows_state.put(
                        at, rows_state.take(at).after(model, last, biasing_next)
                    )
        consumed = [c + n for c, n in zip(progress.consumed, lens, strict=True)]
        return BeamProgress(beams, rows_state, biasing, consumed)

    def best(self, progress: BeamProgress) -> list[TimedTokens]:
        return [hyps[0].timed() if hyps else TimedTokens.empty() for hyps in progress.nbest(1)]

    def nbest(self, progress: BeamProgress) -> list[list[Hypothesis]]:
        """Per utterance its `options.nbest` best hypotheses so far, best first."""
        return progress.nbest(self.options.nbest)
