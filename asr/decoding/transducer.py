"""Greedy transducer search, frame by frame, behind the search contract (`asr.decoding.search`).

`GreedyProgress` is a batch's greedy search between chunks of encoder output: each row's
`HypothesisState`, tokens, their frames and confidences, and the frames consumed. Both
greedy searches carry it: `FrameLoopingGreedy` here (the CPU's) and
`asr.decoding.label_looping.LabelLoopingGreedy` (a GPU's, CUDA graphs), which take the same
decisions. Whole-utterance decoding is `start` + one `advance`; streaming one `advance` per
chunk; rows of different streams are stacked (`GreedyProgress.cat`) and taken apart
(`select`) between steps.

With a biasing graph (`asr.decoding.biasing`, given to `start`), each row picks the best of
log P + what the token earns in the graph (`BiasingGraph.advance`); with a language model
(`asr.decoding.fusion.LmFusion`, given to `start`), + the fused LM score of the token (blank
none): both add. Each emitted token gets
the confidence of the distribution it was taken from (`asr.decoding.confidence`). A
token-and-duration transducer's rows also take the most probable duration and move by it
(`asr.decoding.durations`), skipping the frames between; where a duration takes a row past
the chunk's end, the row's `HypothesisState.skip` carries the rest into the next chunk.

Legend: B batch, T frames, V vocabulary, D width. Call ``model.eval()`` first: decoding does
not change the model's mode, and dropout would make the predictor random.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
from torch import Tensor

from asr.decoding.biasing import BiasingGraph
from asr.decoding.checks import check_encoder_output, check_same_biasing, check_same_lm
from asr.decoding.confidence import token_confidence
from asr.decoding.durations import duration_table, split_logits
from asr.decoding.fusion import LmFusion
from asr.decoding.hypotheses import HypothesisState, TimedTokens
from asr.models.transducer import Transducer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GreedyOptions:
    """max_symbols_per_frame: at most this many non-blank tokens before moving to the next
    frame (a guard against a joiner that never emits blank)."""

    max_symbols_per_frame: int = 3

    def __post_init__(self) -> None:
        if self.max_symbols_per_frame < 1:
            raise ValueError(
                f"max_symbols_per_frame must be >= 1, got {self.max_symbols_per_frame}"
            )


Emitted = tuple[int, int, float, int]  # (token, frame in the chunk, confidence, duration)


@dataclass(frozen=True)
class GreedyProgress:
    """A batch's greedy search between chunks: each row's state (`HypothesisState`), the
    biasing graph the rows are scored with (None: none), the language model fused in
    (`lm`, None: none), each row's tokens, their frames
    (from the start of the audio), confidences and durations (`TimedTokens`), the frames
    consumed (`first_frame` of `start` included) and the frames visited since `start`:
    those the search ran the joiner at (all of them for a plain transducer; a TDT skips
    some, and visited / (consumed - first frame) is the share it ran)."""

    rows: HypothesisState
    biasing: BiasingGraph | None
    tokens: list[list[int]]
    frames: list[list[int]]
    confidences: list[list[float]]
    durations: list[list[int]]
    consumed: list[int]
    visited: list[int]
    lm: LmFusion | None = None

    @classmethod
    def start(
        cls,
        model: Transducer,
        batch_size: int,
        device: torch.device | str,
        biasing: BiasingGraph | None = None,
        first_frame: int = 0,
        lm: LmFusion | None = None,
    ) -> GreedyProgress:
        """`batch_size` rows before their first frame, which is frame `first_frame` of the
        audio (a stream's search that starts again after an endpoint), scored with
        `biasing` and `lm` (None: none)."""
        if biasing is not None and biasing.num_phrases:
            _greedy_biasing_warning()
        lm = None if lm is None else lm.for_model(model.vocab_size, model.blank_id, device)
        return cls(
            HypothesisState.start(model, batch_size, device, lm),
            None if biasing is None else biasing.to(device),
            [[] for _ in range(batch_size)],
            [[] for _ in range(batch_size)],
            [[] for _ in range(batch_size)],
            [[] for _ in range(batch_size)],
            [first_frame] * batch_size,
            [0] * batch_size,
            lm,
        )

    def best(self) -> list[TimedTokens]:
        parts = zip(self.tokens, self.frames, self.confidences, self.durations, strict=True)
        return [TimedTokens(list(t), list(f), list(c), list(d)) for t, f, c, d in parts]

    def select(self, index: list[int]) -> GreedyProgress:
        at = torch.tensor(index, device=self.rows.pred.device)
        return GreedyProgress(
            self.rows.take(at),
            self.biasing,
            [self.tokens[i] for i in index],
            [self.frames[i] for i in index],
            [self.confidences[i] for i in index],
            [self.durations[i] for i in index],
            [self.consumed[i] for i in index],
            [self.visited[i] for i in index],
            self.lm,
        )

    @staticmethod
    def cat(parts: list[GreedyProgress]) -> GreedyProgress:
        return GreedyProgress(
            HypothesisState.cat([p.rows for p in parts]),
            check_same_biasing([p.biasing for p in parts]),
            [t for p in parts for t in p.tokens],
            [f for p in parts for f in p.frames],
            [c for p in parts for c in p.confidences],
            [d for p in parts for d in p.durations],
            [c for p in parts for c in p.consumed],
            [v for p in parts for v in p.visited],
            check_same_lm([p.lm for p in parts]),
        )

    def extended(
        self,
        rows: HypothesisState,
        emitted: list[list[Emitted]],
        encoder_lens: list[int],
        visited: list[int] | None = None,
    ) -> GreedyProgress:
        """This progress after a chunk: the rows' new state, each row's emitted (token,
        frame in the chunk, confidence, duration), the chunk's valid frames per row and
        the frames of them each row visited (None: all)."""
        tokens, frames, confidences, durations = [], [], [], []
        for b, found in enumerate(emitted):
            tokens.append(self.tokens[b] + [token for token, _, _, _ in found])
            frames.append(self.frames[b] + [self.consumed[b] + t for _, t, _, _ in found])
            confidences.append(self.confidences[b] + [c for _, _, c, _ in found])
            durations.append(self.durations[b] + [d for _, _, _, d in found])
        consumed = [c + n for c, n in zip(self.consumed, encoder_lens, strict=True)]
        seen = self.visited
        seen = [
            v + n for v, n in zip(seen, encoder_lens if visited is None else visited, strict=True)
        ]
        return GreedyProgress(
            rows, self.biasing, tokens, frames, confidences, durations, consumed, seen, self.lm
        )


class FrameLoopingGreedy:
    """Greedy search that walks the frames in lock-step for the whole batch: one joiner
    call per (frame, symbol) step. A row that emits a non-blank token advances its
    predictor and stays on the frame; the others keep their state. Each row stops at its
    own length.

    A token-and-duration transducer (`asr.decoding.durations`) moves each row by the
    duration it predicts, so rows sit on different frames: each step runs the joiner at
    the earliest frame a row waits for, for the rows waiting there; the frames no row
    waits for are never visited."""

    def __init__(self, options: GreedyOptions = GreedyOptions()) -> None:
        self.options = options

    def start(
        self,
        model: Transducer,
        batch_size: int,
        device: torch.device | str,
        biasing: BiasingGraph | None = None,
        first_frame: int = 0,
        lm: LmFusion | None = None,
    ) -> GreedyProgress:
        return GreedyProgress.start(model, batch_size, device, biasing, first_frame, lm)

    @torch.inference_mode()
    def advance(
        self, model: Transducer, progress: GreedyProgress, encoder_out: Tensor, encoder_lens: Tensor
    ) -> GreedyProgress:
        """The search after the next frames, encoder_out (B, T, D_enc) with encoder_lens
        (B,) valid."""
        check_encoder_output(encoder_out, encoder_lens)
        joiner, blank, biasing, lm = model.joiner, model.blank_id, progress.biasing, progress.lm
        biasing_next = None if biasing is None else biasing.next
        table = duration_table(model, encoder_out.device)  # None: a plain transducer
        enc = joiner.project_encoder(encoder_out)  # (B, T, D_joint), all frames at once
        rows = progress.rows
        emitted: list[Tensor] = []  # per step: token id, or -1 where nothing was emitted
        confidences: list[Tensor] = []  # per step: the confidence of each row's choice
        durations: list[Tensor] = []  # per step (TDT): the duration of each row's choice
        step_frames: list[int] = []  # per step: its frame
        lens = encoder_lens.to(encoder_out.device)
        last = int(lens.max()) if len(lens) else 0
        at = rows.skip.to(lens.device)  # TDT: each row's next frame in this chunk
        visited = torch.zeros_like(lens)
        if table is not None:  # a blank moves on by at least one frame
            blank_moves = table.clamp(min=1)
        t = 0
        while True:
            if table is None:  # every frame in turn, every row on it
                if t >= last:
                    break
                active = t < lens
            else:  # the earliest frame a row waits for (`last` for the rows done)
                waiting = torch.where(at < lens, at, last)
                t = int(waiting.min())
                if t >= last:
                    break
                active = waiting == t
                visited += active
            for _ in range(self.options.max_symbols_per_frame):
                token_logits, duration_logits = split_logits(
                    model, joiner.joint(enc[:, t], rows.pred)
                )
                log_probs = None  # only for the confidence of what is emitted, or biasing
                if biasing is None and lm is None:
                    tokens = token_logits.argmax(dim=-1)  # (B,)
                elif biasing is None:  # the log-softmax's shift is the same for every token
                    tokens = (token_logits.float() + rows.lm_scores).argmax(dim=-1)
                else:
                    log_probs = token_logits.float().log_softmax(dim=-1)
                    scores = log_probs if lm is None else log_probs + rows.lm_scores
                    bonus = biasing.advance.index_select(0, rows.biasing_node)
                    bonus[:, blank] = 0.0
                    tokens = (scores + bonus).argmax(dim=-1)
                emit = active & (tokens != blank)
                stay = emit
                if table is not None:
                    choice = duration_logits.argmax(dim=-1)
                    moves = torch.where(emit, table[choice], blank_moves[choice])
                    at = torch.where(active, moves.add_(t), at)
                    stay = emit & (moves == t)  # a duration of 0: still on frame t
                if not bool(emit.any()):
                    active = stay
                    break
                if log_probs is None:
                    log_probs = token_logits.float().log_softmax(dim=-1)
                duration = None if table is None else table[choice]
                emitted.append(torch.where(emit, tokens, -1))
                confidences.append(token_confidence(log_probs))
                if duration is not None:
                    durations.append(duration)
                step_frames.append(t)
                rows = rows.where(emit, rows.after(model, tokens, biasing_next, lm))
                active = stay
            if table is None:
                t += 1
            else:  # rows that emitted the most tokens a frame may have move on
                at = torch.where(active, t + 1, at)
        found: list[list[Emitted]] = [[] for _ in progress.consumed]
        if emitted:
            steps = torch.stack(emitted, dim=1).cpu().tolist()  # (B, steps)
            sureness = torch.stack(confidences, dim=1).cpu().tolist()
            lasting = [[1] * len(steps[0]) for _ in steps]  # a plain transducer's: one frame
            if table is not None:
                lasting = torch.stack(durations, dim=1).cpu().tolist()
            for b, row in enumerate(steps):
                found[b] = [
                    (token, step_frames[s], sureness[b][s], lasting[b][s])
                    for s, token in enumerate(row)
                    if token >= 0
                ]
        if table is None:
            return progress.extended(rows, found, encoder_lens.tolist())
        rows = rows.skipping(at - lens)
        return progress.extended(rows, found, encoder_lens.tolist(), visited.tolist())

    def best(self, progress: GreedyProgress) -> list[TimedTokens]:
        return progress.best()


@functools.cache
def _greedy_biasing_warning() -> None:
    log.warning(
        "biasing phrases with greedy search: it can only add a bonus as tokens come, never "
        "take one back, and gains little (recipes/demo/RESULTS.md, 'Context biasing'); a "
        "beam search (--beam-size 8) compares hypotheses and gives back what a failed match "
        "earned"
    )
