"""Transducer beam search (with one token per frame: icefall's modified beam search), batched
over the utterances, behind the search contract (`asr.decoding.search`).

It is frame-synchronous, so it can stop after any frame and go on with the next chunk of
encoder output (streaming): `BeamProgress` holds a batch's search between chunks, and rows
of different streams can be stacked (`cat`) and taken apart (`select`). With a
token-and-duration transducer (`asr.decoding.durations`) each hypothesis sits on the frame
its last duration took it to, and the frames no hypothesis sits on are never visited.

A biasing graph (`asr.decoding.biasing`, given to `start`) adds what each token earns to
its extension's score; each hypothesis carries its state in the graph. A language model
(`asr.decoding.fusion.LmFusion`, given to `start`) adds its fused score of each token (blank
none; both add), and of the sentence's end once, when the hypotheses are read (`nbest`).
Each emitted token gets a confidence from the distribution it was taken from
(`asr.decoding.confidence`).

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
from asr.decoding.checks import (
    check_beam,
    check_encoder_output,
    check_same_biasing,
    check_same_lm,
)
from asr.decoding.confidence import token_confidence
from asr.decoding.durations import durations_of, fold_landings, landings, split_logits
from asr.decoding.fusion import LmFusion
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
    biasing bonus it would give back if the utterance ended here (`held`), whether it has
    ended the round's frame (`ended`) and the frame it goes on from (`at`, in the chunk's
    frames: a later one once it has ended the round's, a TDT's by its duration), and its
    tokens' `durations` (`TimedTokens`)."""

    tokens: tuple[int, ...]
    score: float
    row: int
    token: int
    frames: tuple[int, ...]
    confidences: tuple[float, ...]
    held: float
    ended: bool
    at: int = 0
    durations: tuple[int, ...] = ()
    alignment_score: float = -math.inf

    def __post_init__(self) -> None:
        self.alignment_score = self.score

    def merge(self, other: _Candidate) -> None:
        """Take in `other`, an alignment of the same tokens: the scores log-added, the
        frames (and confidences) of the more probable alignment, the row of one that
        needs no predictor step."""
        if other.score > self.alignment_score:
            self.frames, self.confidences = other.frames, other.confidences
            self.durations = other.durations
            self.alignment_score = other.score
        self.score = _log_add(self.score, other.score)
        if other.token < 0:
            self.row, self.token = other.row, other.token


Place = tuple[tuple[int, ...], int]  # a hypothesis's tokens and the frame it goes on from


def _add(candidates: dict[Place, _Candidate], candidate: _Candidate) -> None:
    """Add `candidate`, merged into one with the same tokens at the same frame if there is
    one."""
    place = (candidate.tokens, candidate.at)
    kept = candidates.get(place)
    if kept is None:
        candidates[place] = candidate
    else:
        kept.merge(candidate)


@dataclass
class _Round:
    """A round's candidates, scored for every row of the batch (B*K first): per row its
    scores with blank (ending the frame), one per frame a blank may move on
    (`blank_moves`: 1 for a plain transducer), its confidence and what it would give
    back; per utterance its best extensions' scores, places ((row * vocab + token) * M +
    m, for the M frames a token may move on, `moves`: 0 or, in the last round, 1 for a
    plain transducer) and what each would give back; per row and move the duration a
    token would get (`lasting`; None: one frame each, a plain transducer)."""

    with_blank: list[list[float]]
    blank_moves: list[int]
    confidence: list[float]
    held_rows: list[float]
    best: list[list[float]]
    where: list[list[int]]
    held_best: list[list[float]]
    vocab: int
    moves: list[int]
    lasting: list[list[int]] | None = None


@dataclass
class _Beam:
    """One utterance's K hypotheses (rows) during beam search: scores (-inf: an empty
    row), tokens, the frame each goes on from (`at`, in the frames of the chunk being
    searched: read from the rows' `HypothesisState.skip` when a chunk starts), and its
    tokens' frames, confidences and durations."""

    scores: list[float]
    tokens: list[tuple[int, ...]]
    at: list[int]
    frames: list[tuple[int, ...]]
    confidences: list[tuple[float, ...]]
    durations: list[tuple[int, ...]]

    @classmethod
    def start(cls, k: int) -> _Beam:
        scores = [0.0] + [-math.inf] * (k - 1)
        return cls(scores, [()] * k, [0] * k, [()] * k, [()] * k, [()] * k)

    def in_frame(self, t: int) -> list[int]:
        """The rows on frame t."""
        rows = zip(self.at, self.scores, strict=True)
        return [j for j, (at, score) in enumerate(rows) if at == t and score > -math.inf]

    def next_frame(self, length: int) -> int | None:
        """The first frame before `length` that a hypothesis goes on from (None: none)."""
        rows = zip(self.at, self.scores, strict=True)
        waiting = [at for at, score in rows if at < length and score > -math.inf]
        return min(waiting, default=None)

    def advance(
        self, found: _Round, utterance: int, t: int, frame: int, last_round: bool
    ) -> list[tuple[int, int]]:
        """Keep the K best of a round's candidates for this beam (`utterance` of the
        batch) at frame t of the chunk: the hypotheses elsewhere (ahead of t, or done with
        it), those on t moving on with blank, and the best token extensions, which stay
        on t or move on with their durations (always in the last round); an appended token
        is at `frame` (of the audio), with the confidence of its row's distribution. Per
        new row: (the row it continues, the token it appends or -1)."""
        k = len(self.scores)
        first = utterance * k
        candidates: dict[Place, _Candidate] = {}
        here = self.in_frame(t)
        for j, score in enumerate(self.scores):
            if j not in here and score > -math.inf:
                _add(candidates, self._kept(j, score, found.held_rows[first + j], self.at[j]))
        for j in here:
            for move, score in zip(found.blank_moves, found.with_blank[first + j], strict=True):
                _add(candidates, self._kept(j, score, found.held_rows[first + j], t + move))
        extensions = zip(
            found.best[utterance], found.where[utterance], found.held_best[utterance], strict=True
        )
        for score, flat, held in extensions:
            if score > -math.inf:
                place, m = divmod(flat, len(found.moves))
                row, token = divmod(place, found.vocab)
                lasting = 1 if found.lasting is None else found.lasting[first + row][m]
                _add(
                    candidates,
                    _Candidate(
                        (*self.tokens[row], token),
                        score,
                        row,
                        token,
                        (*self.frames[row], frame),
                        (*self.confidences[row], found.confidence[first + row]),
                        held,
                        ended=found.moves[m] > 0,
                        at=t + found.moves[m],
                        durations=(*self.durations[row], lasting),
                    ),
                )
        ranked = list(candidates.values())
        by_score = sorted(range(len(ranked)), key=lambda i: -ranked[i].score)
        by_plain = sorted(by_score, key=lambda i: -(ranked[i].score - ranked[i].held))
        kept = [ranked[i] for i in keep_half(by_score, by_plain, k)]
        empty = k - len(kept)
        self.scores = [c.score for c in kept] + [-math.inf] * empty
        self.tokens = [c.tokens for c in kept] + [()] * empty
        self.at = [c.at if c.ended else t for c in kept] + [t] * empty
        self.frames = [c.frames for c in kept] + [()] * empty
        self.confidences = [c.confidences for c in kept] + [()] * empty
        self.durations = [c.durations for c in kept] + [()] * empty
        moves = [(c.row, c.token) for c in kept]
        return moves + [(j, -1) for j in range(len(kept), k)]

    def _kept(self, j: int, score: float, held: float, at: int) -> _Candidate:
        """Row j's hypothesis as it is, with `score`, going on from frame `at`."""
        return _Candidate(
            self.tokens[j],
            score,
            j,
            -1,
            self.frames[j],
            self.confidences[j],
            held,
            ended=True,
            at=at,
            durations=self.durations[j],
        )


def _merged(a: Hypothesis, b: Hypothesis) -> Hypothesis:
    """One hypothesis of two with the same tokens: the scores log-added, the frames,
    confidences and durations of the more probable."""
    best = a if a.score >= b.score else b
    return dataclasses.replace(best, score=_log_add(a.score, b.score))


@dataclass(frozen=True)
class BeamProgress:
    """Beam search of a batch between chunks: per utterance its `_Beam` of K rows, every
    row's state (B * K rows, `HypothesisState`), the biasing graph (None: none), the
    frames each utterance has consumed (`first_frame` of `start` included) and those it
    visited since `start` (ran the joiner at: all for a plain transducer, fewer for a
    TDT), and the language model fused in (None: none)."""

    beams: list[_Beam]
    rows: HypothesisState
    biasing: BiasingGraph | None
    consumed: list[int]
    visited: list[int]
    lm: LmFusion | None = None

    @property
    def beam_size(self) -> int:
        return len(self.beams[0].scores) if self.beams else 0

    def nbest(self, n: int) -> list[list[Hypothesis]]:
        """Per utterance its `n` best hypotheses so far, best first, scored as if the
        utterance ended here (a partial match of a biasing phrase gives its bonus back,
        a language model scores the sentence's end; a TDT's hypotheses with the same
        tokens on different frames are one, their scores log-added)."""
        k = self.beam_size
        held = [0.0] * (len(self.beams) * k)
        if self.biasing is not None:
            held = self.biasing.held[self.rows.biasing_node].tolist()
        if self.lm is not None:  # what ending earns: the opposite of what is given back
            ends = self.lm.end_scores(self.rows.lm_states).tolist()
            held = [h - e for h, e in zip(held, ends, strict=True)]
        results = []
        for b, beam in enumerate(self.beams):
            rows = zip(
                beam.tokens,
                beam.scores,
                beam.frames,
                beam.confidences,
                beam.durations,
                held[b * k : b * k + k],
                strict=True,
            )
            hyps: dict[tuple[int, ...], Hypothesis] = {}
            for seq, score, frames, sure, lasting, gives in rows:
                if score > -math.inf:
                    hyp = Hypothesis(seq, score - gives, frames, sure, lasting)
                    hyps[seq] = _merged(hyps[seq], hyp) if seq in hyps else hyp
            results.append(sorted(hyps.values(), key=lambda h: -h.score)[:n])
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
            [self.visited[i] for i in index],
            self.lm,
        )

    @staticmethod
    def cat(parts: list[BeamProgress]) -> BeamProgress:
        return BeamProgress(
            [b for p in parts for b in p.beams],
            HypothesisState.cat([p.rows for p in parts]),
            check_same_biasing([p.biasing for p in parts]),
            [c for p in parts for c in p.consumed],
            [v for p in parts for v in p.visited],
            check_same_lm([p.lm for p in parts]),
        )


def _score_round(
    model: Transducer,
    logits: Tensor,
    beams: list[_Beam],
    live: list[int],
    nodes: Tensor,
    biasing: BiasingGraph | None,
    last_round: bool,
    lm_scores: Tensor | None = None,
) -> _Round:
    """Score the V extensions of the rows `live` (B*K joiner outputs): each hypothesis's
    score + log P (+ the token's gain in `biasing`, blank none; + its fused LM score
    `lm_scores` (B*K, V), blank none; + log P(duration) for a
    TDT, per frame the durations move it on: `fold_landings`), the K best per utterance
    (with a biasing graph, also the K best as if every partial match ended:
    `keep_half`)."""
    k, blank = len(beams[0].scores), model.blank_id
    batch, device = len(beams), logits.device
    dtype = torch.promote_types(logits.dtype, torch.float32)
    token_logits, duration_logits = split_logits(model, logits)
    log_probs = token_logits.to(dtype).log_softmax(dim=-1)
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
    if lm_scores is not None:
        totals[at] += lm_scores[at].to(dtype)
    confidence = token_confidence(log_probs).tolist()
    durations = durations_of(model)
    if durations is None:  # a blank moves one frame on, a token none (all: the last round)
        with_blank = [[score] for score in totals[:, blank].tolist()]
        blank_moves, moves, lasting = [1], [1 if last_round else 0], None
        totals[:, blank] = -math.inf
        totals = totals[:, :, None]  # (B*K, V, 1)
    else:
        duration_log_probs = duration_logits.to(dtype).log_softmax(dim=-1)
        blank_moves_ = landings(durations, blank=True, last_round=last_round)
        by_blank, _, blank_moves = fold_landings(duration_log_probs, blank_moves_)
        with_blank = (totals[:, blank, None] + by_blank).tolist()
        token_moves = landings(durations, blank=False, last_round=last_round)
        by_token, which, moves = fold_landings(duration_log_probs, token_moves)
        lasting = torch.tensor(durations, device=device)[which].tolist()
        totals[:, blank] = -math.inf
        totals = totals[:, :, None] + by_token[:, None, :]  # (B*K, V, M)
    best, where = totals.reshape(batch, -1).topk(k, dim=-1)
    if biasing is None:
        held_best = [[0.0] * k for _ in range(batch)]
        best_, where_ = best.tolist(), where.tolist()
    else:
        best_, where_, held_best = _with_plain_best(totals, where, biasing, nodes, k)
    return _Round(
        with_blank,
        blank_moves,
        confidence,
        held_rows,
        best_,
        where_,
        held_best,
        vocab,
        moves,
        lasting,
    )


def _with_plain_best(
    totals: Tensor, where: Tensor, biasing: BiasingGraph, nodes: Tensor, k: int
) -> tuple[list[list[float]], list[list[int]], list[list[float]]]:
    """Per utterance the token extensions of `where` (the K best of `totals` (B*K, V, M)
    by score) and the K best by score less the bonus their state would give back
    (`BiasingGraph.held`), without repeats: (scores, places as in `where`, what each
    would give back)."""
    batch = totals.size(0) // k
    held = biasing.held[biasing.next[nodes]][:, :, None].expand_as(totals)  # (B*K, V, M)
    plain = (totals - held).reshape(batch, -1).topk(k, dim=-1).indices
    flat = torch.cat([where, plain], dim=1)
    scores = totals.reshape(batch, -1).gather(1, flat).tolist()
    gives = held.reshape(batch, -1).gather(1, flat).tolist()
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

    With a token-and-duration transducer (`asr.decoding.durations`) every extension also
    picks a duration, and scores log P(token) + log P(duration): blank moves the
    hypothesis max(d, 1) frames on, a token d frames (d = 0: it stays in the frame for
    another round, as above; in round S it moves one frame on). Hypotheses so sit on
    different frames: the search visits, in order, the frames some hypothesis of the
    batch sits on, and there the hypotheses on the frame take their rounds while the
    others (ahead, or done with it) compete for the K places as they are; candidates
    merge when their tokens and their frame are the same. Durations that land one
    hypothesis on the same frame (a blank's 0 and 1; a token's 0 and 1 in round S) are
    one candidate, scored with the more probable of them (`fold_landings`), as greedy
    search takes the most probable duration: so with K = 1 this is still greedy search
    (tokens, frames, confidences and durations; NeMo's TDT beam instead drops a blank's
    duration 0, and its beam 1 can differ from its greedy search).

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
        lm: LmFusion | None = None,
    ) -> BeamProgress:
        k = self.options.beam_size
        lm = None if lm is None else lm.for_model(model.vocab_size, model.blank_id, device)
        return BeamProgress(
            [_Beam.start(k) for _ in range(batch_size)],
            HypothesisState.start(model, batch_size * k, device, lm),
            None if biasing is None else biasing.to(device),
            [first_frame] * batch_size,
            [0] * batch_size,
            lm,
        )

    @torch.inference_mode()
    def advance(
        self, model: Transducer, progress: BeamProgress, encoder_out: Tensor, encoder_lens: Tensor
    ) -> BeamProgress:
        """The search after the next frames, encoder_out (B, T, D_enc) with encoder_lens
        (B,) valid."""
        check_encoder_output(encoder_out, encoder_lens)
        joiner, biasing, lm = model.joiner, progress.biasing, progress.lm
        biasing_next = None if biasing is None else biasing.next
        rows_state = progress.rows
        batch, device, k = encoder_out.size(0), encoder_out.device, progress.beam_size
        if k != self.options.beam_size:
            raise ValueError(
                f"the search was started with beam size {k}, not {self.options.beam_size}"
            )
        skip = rows_state.skip.tolist()  # where each row goes on from in this chunk
        beams = [
            dataclasses.replace(beam, at=skip[b * k : b * k + k])
            for b, beam in enumerate(progress.beams)
        ]
        rows = batch * k
        enc = joiner.project_encoder(encoder_out)  # (B, T, D_joint)
        lens = encoder_lens.tolist()
        visited = list(progress.visited)
        while True:
            waiting = [beam.next_frame(n) for beam, n in zip(beams, lens, strict=True)]
            if all(w is None for w in waiting):
                break
            t = min(w for w in waiting if w is not None)  # a plain transducer's: each in turn
            here = [b for b, w in enumerate(waiting) if w == t]
            for b in here:
                visited[b] += 1
            enc_t = enc[:, t].repeat_interleave(k, dim=0)
            for round_ in range(1, self.options.max_symbols_per_frame + 1):
                live = [b * k + j for b in here for j in beams[b].in_frame(t)]
                if not live:
                    break
                logits = joiner.joint(enc_t, rows_state.pred)  # (B*K, V [+ D])
                last_round = round_ == self.options.max_symbols_per_frame
                nodes = rows_state.biasing_node
                found = _score_round(
                    model, logits, beams, live, nodes, biasing, last_round, rows_state.lm_scores
                )
                source = list(range(rows))  # the row each new row continues
                appended = [-1] * rows  # the token it appends (-1: none)
                for b in here:
                    beam = beams[b]
                    if not beam.in_frame(t):
                        continue
                    frame = progress.consumed[b] + t
                    for j, (row, token) in enumerate(beam.advance(found, b, t, frame, last_round)):
                        source[b * k + j], appended[b * k + j] = b * k + row, token
                rows_state = rows_state.take(torch.tensor(source, device=device))
                emitting = [i for i, token in enumerate(appended) if token >= 0]
                if emitting:
                    at = torch.tensor(emitting, device=device)
                    last = torch.tensor([appended[i] for i in emitting], device=device)
                    rows_state = rows_state.put(
                        at, rows_state.take(at).after(model, last, biasing_next, lm)
                    )
        skip = [max(at - n, 0) for beam, n in zip(beams, lens, strict=True) for at in beam.at]
        rows_state = rows_state.skipping(torch.tensor(skip, device=rows_state.skip.device))
        consumed = [c + n for c, n in zip(progress.consumed, lens, strict=True)]
        return BeamProgress(beams, rows_state, biasing, consumed, visited, lm)

    def best(self, progress: BeamProgress) -> list[TimedTokens]:
        return [hyps[0].timed() if hyps else TimedTokens.empty() for hyps in progress.nbest(1)]

    def nbest(self, progress: BeamProgress) -> list[list[Hypothesis]]:
        """Per utterance its `options.nbest` best hypotheses so far, best first."""
        return progress.nbest(self.options.nbest)
