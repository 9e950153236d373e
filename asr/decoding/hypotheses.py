"""What every transducer search keeps of its hypotheses, once.

A search holds its hypotheses as rows of batched tensors. `HypothesisState` is what a row
carries into the next step besides its tokens: the predictor's output and state after its
last token, its place in the biasing graph (`asr.decoding.biasing`), and the frames a
token-and-duration transducer's last duration still skips (`asr.decoding.durations`), and
with a language model (`asr.decoding.fusion`), its LM states and the fused LM score of
every next token.
Taking rows (`take`), stacking them (`cat`), replacing some (`put`) and choosing per row
between two states (`where`) carry every field at once, so a per-hypothesis state that a
new search feature needs is one more field here and one more line in `after` (as the LM
state was), and every search carries it.

What a search gives back: `TimedTokens` (a hypothesis's tokens, the encoder frame of each,
counted from the start of the audio or stream, the search's confidence in each and the
frames each lasts) and, for n-best lists, `Hypothesis` (the same with its score).

Legend: R rows (hypotheses), D_joint the joiner's width, V vocabulary.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from asr.decoding.fusion import LmFusion
from asr.models.transducer import PredictorState, Transducer


@dataclass(frozen=True)
class TimedTokens:
    """A hypothesis's token ids (no blanks), the encoder frame each was emitted at, the
    search's confidence in each (`asr.decoding.confidence`) and the frames each lasts: a
    token-and-duration transducer's predicted duration (0: the next emission comes in the
    same frame), one frame for a plain transducer's (`durations` None fills them in)."""

    tokens: list[int]
    frames: list[int]
    confidences: list[float]
    durations: list[int] | None = None  # None: one frame each (filled in)

    def __post_init__(self) -> None:
        if self.durations is None:
            object.__setattr__(self, "durations", [1] * len(self.tokens))
        if not len(self.tokens) == len(self.frames) == len(self.confidences) == len(self.durations):
            raise ValueError(
                f"{len(self.tokens)} tokens, {len(self.frames)} frames, "
                f"{len(self.confidences)} confidences and {len(self.durations)} durations"
            )

    @classmethod
    def empty(cls) -> TimedTokens:
        return cls([], [], [])


@dataclass(frozen=True)
class Hypothesis:
    """A token sequence (no blanks), its log-probability summed over the alignments that
    were merged into it (plus its biasing bonus, where a graph was given), and the frame
    each token was emitted at, its confidence and the frames it lasts (`TimedTokens`) in
    the most probable of them."""

    tokens: tuple[int, ...]
    score: float
    frames: tuple[int, ...] = ()
    confidences: tuple[float, ...] = ()
    durations: tuple[int, ...] | None = None

    def timed(self) -> TimedTokens:
        durations = None if self.durations is None else list(self.durations)
        return TimedTokens(list(self.tokens), list(self.frames), list(self.confidences), durations)


# -- rows of a batch-first predictor state (a tensor or a tuple of them) -------------------


def take_rows(state: PredictorState, index: Tensor) -> PredictorState:
    """Rows `index` of a batch-first predictor state."""
    if isinstance(state, Tensor):
        return state.index_select(0, index)
    return tuple(take_rows(part, index) for part in state)


def cat_rows(states: list[PredictorState]) -> PredictorState:
    """Batch-first predictor states stacked along the batch."""
    if isinstance(states[0], Tensor):
        return torch.cat(states)
    return tuple(cat_rows([s[i] for s in states]) for i in range(len(states[0])))


def put_rows(state: PredictorState, index: Tensor, rows: PredictorState) -> PredictorState:
    """`state` with its rows `index` replaced by `rows`."""
    if isinstance(state, Tensor):
        return state.index_copy(0, index, rows)
    return tuple(put_rows(s, index, r) for s, r in zip(state, rows, strict=True))


def where_rows(mask: Tensor, new: PredictorState, old: PredictorState) -> PredictorState:
    """Per row: `new` where mask (R,) is True, else `old`."""
    if isinstance(new, Tensor):
        return torch.where(mask.view(-1, *([1] * (new.dim() - 1))), new, old)
    return tuple(where_rows(mask, n, o) for n, o in zip(new, old, strict=True))


def copy_rows_into(target: PredictorState, source: PredictorState) -> None:
    """Copy a predictor state into `target`'s tensors, in place (static buffers)."""
    if isinstance(target, Tensor):
        target.copy_(source)
        return
    for t, s in zip(target, source, strict=True):
        copy_rows_into(t, s)


def zeros_like_rows(state: PredictorState, rows: int) -> PredictorState:
    """Zeros of `state`'s shape with `rows` rows."""
    if isinstance(state, Tensor):
        return state.new_zeros((rows, *state.shape[1:]))
    return tuple(zeros_like_rows(s, rows) for s in state)


def _optional(op, *parts):
    """`op` of tensors that are all None (no LM) or all tensors."""
    return None if parts[0] is None else op(*parts)


@dataclass(frozen=True)
class HypothesisState:
    """What each row carries into the next step: `pred` (R, D_joint) the projected
    predictor output after its last token, `predictor` the predictor's state,
    `biasing_node` (R,) its state in the biasing graph (0, the root, without one), and
    `skip` (R,) the frames it skips before the next one it visits, counted from the
    first frame of the next chunk: a TDT duration that jumped past the end of a chunk
    leaves the rest here (`asr.decoding.durations`; always 0 for a plain transducer).
    Within a chunk each search keeps its rows' frames in its own working form and writes
    `skip` when the chunk is done. With a language model (`asr.decoding.fusion.LmFusion`;
    None without): `lm_states` (R, P) its state in each of the P LMs and `lm_scores`
    (R, V) the fused LM score of every next token (0 for blank)."""

    pred: Tensor
    predictor: PredictorState
    biasing_node: Tensor
    skip: Tensor
    lm_states: Tensor | None = None
    lm_scores: Tensor | None = None

    @classmethod
    def start(
        cls, model: Transducer, rows: int, device: torch.device | str, lm: LmFusion | None = None
    ) -> HypothesisState:
        """`rows` hypotheses before their first token (the predictor fed blank; the LMs
        after <s>)."""
        predictor, joiner = model.predictor, model.joiner
        blanks = torch.full((rows,), model.blank_id, device=device, dtype=torch.long)
        out, state = predictor.step(blanks, predictor.init_state(rows, device))
        nodes = torch.zeros(rows, dtype=torch.long, device=device)
        lm_states = lm_scores = None
        if lm is not None:
            lm_states = lm.start(rows, device)
            lm_scores = lm.scores(lm_states)
        return cls(
            joiner.project_predictor(out),
            state,
            nodes,
            torch.zeros_like(nodes),
            lm_states,
            lm_scores,
        )

    def after(
        self,
        model: Transducer,
        tokens: Tensor,
        biasing_next: Tensor | None,
        lm: LmFusion | None = None,
    ) -> HypothesisState:
        """Every row's state after appending `tokens` (R,): the predictor stepped and
        projected, the biasing node moved along `biasing_next` (the graph's `next` table;
        None: no graph, the nodes stay), the LM states stepped and scored (`lm`, None: no
        LM); `skip` stays (the search moves the frames)."""
        out, state = model.predictor.step(tokens, self.predictor)
        nodes = self.biasing_node
        if biasing_next is not None:
            nodes = biasing_next[nodes, tokens]
        lm_states, lm_scores = self.lm_states, self.lm_scores
        if lm is not None:
            lm_states = lm.step(lm_states, tokens)
            lm_scores = lm.scores(lm_states)
        return HypothesisState(
            model.joiner.project_predictor(out), state, nodes, self.skip, lm_states, lm_scores
        )

    def skipping(self, skip: Tensor) -> HypothesisState:
        """This state with each row's `skip` (R,) set (the end of a chunk)."""
        return dataclasses.replace(self, skip=skip)

    def take(self, index: Tensor) -> HypothesisState:
        def rows(t):
            return t.index_select(0, index)

        return HypothesisState(
            self.pred.index_select(0, index),
            take_rows(self.predictor, index),
            self.biasing_node.index_select(0, index),
            self.skip.index_select(0, index),
            _optional(rows, self.lm_states),
            _optional(rows, self.lm_scores),
        )

    @staticmethod
    def cat(parts: list[HypothesisState]) -> HypothesisState:
        with_lm = {p.lm_states is not None for p in parts}
        if len(with_lm) > 1:
            raise ValueError("hypotheses with and without a language model cannot be stacked")

        def stacked(name: str) -> Tensor | None:
            return None if True not in with_lm else torch.cat([getattr(p, name) for p in parts])

        return HypothesisState(
            torch.cat([p.pred for p in parts]),
            cat_rows([p.predictor for p in parts]),
            torch.cat([p.biasing_node for p in parts]),
            torch.cat([p.skip for p in parts]),
            stacked("lm_states"),
            stacked("lm_scores"),
        )

    def put(self, index: Tensor, rows: HypothesisState) -> HypothesisState:
        """This state with its rows `index` replaced by `rows`."""

        def put(t: Tensor, r: Tensor) -> Tensor:
            return t.index_copy(0, index, r)

        return HypothesisState(
            self.pred.index_copy(0, index, rows.pred.to(self.pred.dtype)),
            put_rows(self.predictor, index, rows.predictor),
            self.biasing_node.index_copy(0, index, rows.biasing_node),
            self.skip.index_copy(0, index, rows.skip),
            _optional(put, self.lm_states, rows.lm_states),
            _optional(put, self.lm_scores, rows.lm_scores),
        )

    def where(self, mask: Tensor, new: HypothesisState) -> HypothesisState:
        """Per row: `new`'s where mask (R,) is True, else this state's."""
        nodes, skip = self.biasing_node, self.skip
        if new.biasing_node is not nodes:  # (`after` without a graph keeps the same tensor)
            nodes = torch.where(mask, new.biasing_node, nodes)
        if new.skip is not skip:  # (`after` keeps the same tensor)
            skip = torch.where(mask, new.skip, skip)

        def pick(n: Tensor, o: Tensor) -> Tensor:
            return torch.where(mask[:, None], n, o)

        return HypothesisState(
            torch.where(mask[:, None], new.pred, self.pred),
            where_rows(mask, new.predictor, self.predictor),
            nodes,
            skip,
            _optional(pick, new.lm_states, self.lm_states),
            _optional(pick, new.lm_scores, self.lm_scores),
        )
