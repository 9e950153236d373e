"""Batched greedy transducer search in the label-looping form, capturable by CUDA graphs.

After Bataev et al., "Label-Looping: Highly Efficient Decoding for Transducers" (2024;
NeMo's default greedy search). The frame-looping search (`transducer.greedy_continue`)
walks frames in lock-step for the whole batch and asks the GPU after every step whether
any sample emitted, so a batch of T frames costs at least T round trips from Python. Here
each utterance loops over *labels*: an inner loop moves its own frame index over blanks
(joiner only), and once it finds a label, the outer step records it and advances the
predictor. Every step is the same fixed-shape work for the whole batch, masked per row,
over tensors allocated once (`_Buffers`), so it can be captured as one CUDA graph and
replayed several times between checks of whether anything is left to do
(`asr.decoding.cuda_graphs`).

The decisions of each utterance are those of frame-looping greedy search, so the two give
the same tokens and frames (tested on CPU): at frame t, a blank moves to t + 1; a label is
emitted and the utterance stays on t, until `max_symbols_per_frame` labels there move it
to t + 1 (a guard against a joiner that never emits blank). A token-and-duration
transducer's durations (`asr.decoding.durations`) move a blank max(d, 1) frames on and a
label d frames on (d = 0: it stays, as above): the frame index of each row simply jumps,
in both loops, and the frames it jumps over are never visited.

It carries the same `GreedyProgress` as the frame-looping search (`start` + `advance` per
chunk, `asr.decoding.search`): `advance` loads each row's predictor state and biasing node
into the buffers and reads them back after the chunk, so the two searches can even take
turns on one stream. A biasing graph (`asr.decoding.biasing`, phrases to boost) is read the
same way: its tables are copied into static buffers (at least as many states), each row
keeps its state, and the inner step adds what each token earns to the log-probabilities,
as the frame-looping search does: the same tokens again.

A language model (`asr.decoding.fusion.LmFusion`, given to `start`) is fused the same way:
each row's LM states (P LMs: shallow fusion, and LODR's) and the fused LM score of every
next token are static buffers, loaded from the progress's `HypothesisState` and written back
after the chunk; the inner step picks argmax(log P + LM scores [+ biasing bonus]) (blank
gets no LM score), and the outer step steps the LM states of the rows that emitted and
scores their next tokens (`TokenLm.lookup`: searchsorted, gathers and where over fixed
shapes, so the graph captures it). The graph reads the LM's tables where they are (no copy:
an LM can take gigabytes), so the search and its graph are kept per LM object, as long as
that object lives (`kept_with`'s `owner`).

Legend: B batch, T frames, D joint width, S = T x max_symbols_per_frame + 1 label slots,
N context states, V vocabulary, P LMs fused.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from asr.decoding.biasing import BiasingGraph
from asr.decoding.checks import check_encoder_output
from asr.decoding.confidence import token_confidence
from asr.decoding.cuda_graphs import KeptBuffers, ModelRef, kept_with, run_steps
from asr.decoding.durations import duration_table, split_logits
from asr.decoding.fusion import LmFusion
from asr.decoding.hypotheses import (
    HypothesisState,
    TimedTokens,
    copy_rows_into,
    take_rows,
    zeros_like_rows,
)
from asr.decoding.transducer import GreedyOptions, GreedyProgress
from asr.models.transducer import PredictorState, Transducer

Loops = Literal["auto", "eager", "fused"]


@dataclass
class _Buffers:
    """Everything a search step reads or writes, allocated once for B rows and T frames.

    `enc` (B, T, D) projected encoder output; `lens` (B,) valid frames (0 on unused rows);
    `frame` (B,) each row's current frame; `symbols` (B,) labels emitted at it; `label`
    (B,) the label found by the inner loop; `need` (B,) still looking for a label;
    `active` (B,) frames left; `pred` (B, D) projected predictor output and `state` the
    predictor state after each row's last label; `labels`, `frames`, `confidences`
    (B, S) what was emitted, where and how surely; `count` (B,) how many; `confidence`
    (B,) that of the label found by the inner loop; `node` (B,) each row's biasing state
    (0 without a graph). A biased search also has the graph's tables `biasing_next`,
    `biasing_advance` (N, V); None otherwise. A TDT's search also has `duration_frames`
    (D,) the frames of each duration, `duration` (B,) that of the label found by the
    inner loop, `durations` (B, S) those of the labels emitted, and `visited` (B,) the
    frames each row has run the joiner at; None otherwise. A search that fuses an LM has
    `lm_states` (B, P) each row's LM states and `lm_scores` (B, V) the fused LM score of
    every next token (0 for blank); None otherwise.
    """

    enc: Tensor
    lens: Tensor
    rows: Tensor
    frame: Tensor
    symbols: Tensor
    label: Tensor
    need: Tensor
    active: Tensor
    pred: Tensor
    state: PredictorState
    labels: Tensor
    frames: Tensor
    confidences: Tensor
    count: Tensor
    confidence: Tensor
    node: Tensor
    biasing_next: Tensor | None = None
    biasing_advance: Tensor | None = None
    duration_frames: Tensor | None = None
    duration: Tensor | None = None
    durations: Tensor | None = None
    visited: Tensor | None = None
    lm_states: Tensor | None = None
    lm_scores: Tensor | None = None

    @property
    def capacity(self) -> tuple[int, int]:
        return self.enc.size(0), self.enc.size(1)


class LabelLoopingGreedy:
    """Greedy search in the label-looping form, with the search contract
    (`start`/`advance`/`best`) and `GreedyProgress`.

    `loops`: "auto" replays the fused step from a CUDA graph on CUDA and runs the eager
    loops elsewhere; "eager": the eager loops (inner steps until every row has found its
    label, then one outer step: fewest predictor calls), on any device; "fused": the
    graph's fused step (one inner step, then the outer step of the rows that found a
    label), replayed from a CUDA graph on CUDA and run eagerly elsewhere (how a CPU tests
    it). The buffers and graph of a model are kept with it (`kept_with`) and reused for
    batches that fit.
    """

    def __init__(self, options: GreedyOptions = GreedyOptions(), loops: Loops = "auto") -> None:
        if loops not in ("auto", "eager", "fused"):
            raise ValueError(f"loops must be auto, eager or fused, got {loops!r}")
        self.options, self.loops = options, loops

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

    def advance(
        self, model: Transducer, progress: GreedyProgress, encoder_out: Tensor, encoder_lens: Tensor
    ) -> GreedyProgress:
        """The search after the next frames, encoder_out (B, T, D_enc) with encoder_lens
        (B,) valid."""
        cuda = encoder_out.device.type == "cuda"
        fused = self.loops == "fused" or (self.loops == "auto" and cuda)
        graphs = fused and cuda
        biased, lm = progress.biasing is not None, progress.lm
        key: tuple = (_LabelLoops, self.options, biased, graphs)
        if lm is not None:  # the graph reads its tables in place: one search per LM object,
            key += (id(lm),)  # dropped when it goes (before its id can name another)
        loops = kept_with(
            model, key, lambda: _LabelLoops(model, self.options, graphs, biased, lm), owner=lm
        )
        return loops.advance(progress, encoder_out, encoder_lens, fused)

    def best(self, progress: GreedyProgress) -> list[TimedTokens]:
        return progress.best()


class _LabelLoops:
    """A model's label-looping loops over its kept buffers (and, on CUDA with
    `use_cuda_graphs`, the CUDA graph of the fused step). `biased`: the buffers hold a
    biasing graph's tables (an unbiased search keeps its exact steps). `lm`: the LM fusion
    (`GreedyProgress.lm`, None: none) its steps read, referred to weakly (the search is
    kept with the model, and must not keep the LM alive)."""

    def __init__(
        self,
        model: Transducer,
        options: GreedyOptions,
        use_cuda_graphs: bool,
        biased: bool,
        lm: LmFusion | None = None,
    ) -> None:
        self._model = ModelRef(model)
        self._lm = None if lm is None else weakref.ref(lm)
        self.options, self.use_cuda_graphs, self.biased = options, use_cuda_graphs, biased
        self.kept = KeptBuffers(self._fused_step)

    @property
    def model(self) -> Transducer:
        return self._model()

    @property
    def lm(self) -> LmFusion | None:
        if self._lm is None:
            return None
        lm = self._lm()
        if lm is None:
            raise RuntimeError("the language model of this search was freed: build a new search")
        return lm

    @torch.inference_mode()
    def advance(
        self, progress: GreedyProgress, encoder_out: Tensor, encoder_lens: Tensor, fused: bool
    ) -> GreedyProgress:
        """`fused`: the graph's loop (replayed on CUDA with graphs, its body run eagerly
        elsewhere), else the eager loops."""
        check_encoder_output(encoder_out, encoder_lens)
        if progress.lm is not self.lm:
            raise ValueError("this search fuses another language model than the progress's")
        batch, frames = encoder_out.size(0), encoder_out.size(1)
        if batch == 0 or frames == 0:
            return progress.extended(progress.rows, [[] for _ in range(batch)], [0] * batch)
        enc = self.model.joiner.project_encoder(encoder_out)
        graphs = self.use_cuda_graphs and enc.device.type == "cuda"
        biasing = progress.biasing
        sizes = (batch, frames) if biasing is None else (batch, frames, biasing.num_states)
        buffers, step = self.kept.get(
            sizes,
            (enc.device, enc.dtype),
            lambda sizes: self._allocate(enc, *sizes),
            enc.device,
            graphs,
        )
        self._reset(buffers, enc, encoder_lens, progress)
        if fused:
            run_steps(step, lambda: not bool(buffers.active.any()))
        else:
            self._eager_loops(buffers)
        return self._results(buffers, progress, encoder_lens)

    # -- buffers ----------------------------------------------------------------------

    def _allocate(self, enc: Tensor, batch: int, frames: int, states: int = 0) -> _Buffers:
        device, slots = enc.device, frames * self.options.max_symbols_per_frame + 1
        model, blank = self.model, self.model.blank_id
        lm = self.lm
        start = HypothesisState.start(model, batch, device, lm)

        def longs(*shape: int) -> Tensor:
            return torch.zeros(shape, dtype=torch.long, device=device)

        def flags() -> Tensor:
            return torch.zeros(batch, dtype=torch.bool, device=device)

        vocab = model.joiner.vocab_size
        optional = {}
        if self.biased:
            optional |= {
                "biasing_next": longs(states, vocab),
                "biasing_advance": torch.zeros(states, vocab, device=device),
            }
        table = duration_table(model, device)
        if table is not None:
            optional |= {
                "duration_frames": table,
                "duration": longs(batch),
                "durations": longs(batch, slots),
                "visited": longs(batch),
            }
        if lm is not None:
            optional |= {
                "lm_states": torch.zeros_like(start.lm_states),
                "lm_scores": torch.zeros_like(start.lm_scores),
            }
        return _Buffers(
            enc=enc.new_zeros((batch, frames, enc.size(2))),
            lens=longs(batch),
            rows=torch.arange(batch, device=device),
            frame=longs(batch),
            symbols=longs(batch),
            label=torch.full((batch,), blank, dtype=torch.long, device=device),
            need=flags(),
            active=flags(),
            pred=torch.zeros_like(start.pred),
            state=zeros_like_rows(start.predictor, batch),
            labels=longs(batch, slots),
            frames=longs(batch, slots),
            confidences=torch.zeros(batch, slots, device=device),
            count=longs(batch),
            confidence=torch.zeros(batch, device=device),
            node=longs(batch),
            **optional,
        )

    def _reset(
        self, b: _Buffers, enc: Tensor, encoder_lens: Tensor, progress: GreedyProgress
    ) -> None:
        """The state before the chunk's first frame, for the utterances of `enc` in the
        first rows: each row's predictor state, biasing node and LM states and scores from
        `progress` (and the graph's tables in the first rows of a biased search's); the
        other rows get blank's start state and no frames."""
        batch, frames = enc.size(0), enc.size(1)
        rows = b.capacity[0]
        b.enc[:batch, :frames].copy_(enc)
        b.lens.zero_()
        b.lens[:batch].copy_(encoder_lens.to(enc.device))
        for t in (b.frame, b.symbols, b.count):
            t.zero_()
        b.label.fill_(self.model.blank_id)
        state = progress.rows
        if rows > batch:  # rows the batch does not use: a valid state, never read back
            idle = HypothesisState.start(self.model, rows - batch, enc.device, self.lm)
            state = HypothesisState.cat([state, idle])
        b.pred.copy_(state.pred)
        copy_rows_into(b.state, state.predictor)
        b.node.copy_(state.biasing_node)
        if b.lm_states is not None:
            b.lm_states.copy_(state.lm_states)
            b.lm_scores.copy_(state.lm_scores)
        if b.visited is not None:  # a TDT's row starts where its last duration took it
            b.frame.copy_(state.skip)
        torch.lt(b.frame, b.lens, out=b.active)
        if b.visited is not None:
            b.visited.copy_(b.active)
        b.need.copy_(b.active)
        if progress.biasing is not None:
            biasing = progress.biasing.to(enc.device)
            states = biasing.num_states
            b.biasing_next.zero_()
            b.biasing_advance.zero_()
            b.biasing_next[:states].copy_(biasing.next)
            b.biasing_advance[:states].copy_(biasing.advance)

    # -- the steps ----------------------------------------------------------------------

    def _inner_step(self, b: _Buffers) -> None:
        """Rows looking for a label: the joiner at their frame (its log-probabilities plus
        the LM's and biasing's scores, in the frame-looping search's order); a blank moves
        them on."""
        last = b.enc.size(1) - 1
        enc = b.enc[b.rows, b.frame.clamp(max=last)]  # (B, D)
        logits, duration_logits = split_logits(self.model, self.model.joiner.joint(enc, b.pred))
        log_probs = logits.float().log_softmax(dim=-1)
        if b.biasing_advance is None and b.lm_scores is None:
            best = logits.argmax(dim=-1)
        elif b.biasing_advance is None:  # the log-softmax's shift is the same for every token
            best = (logits.float() + b.lm_scores).argmax(dim=-1)
        else:
            scores = log_probs if b.lm_scores is None else log_probs + b.lm_scores
            if b.biasing_advance is not None:
                scores = scores + b.biasing_advance.index_select(0, b.node)
            best = scores.argmax(dim=-1)
        is_blank = best == self.model.blank_id
        moves = b.need & is_blank
        found = b.need & ~is_blank
        b.label.copy_(torch.where(found, best, b.label))
        b.confidence.copy_(torch.where(found, token_confidence(log_probs), b.confidence))
        if b.duration_frames is None:
            b.frame.add_(moves.long())
        else:  # a blank moves on at least one frame
            duration = b.duration_frames[duration_logits.argmax(dim=-1)]
            b.duration.copy_(torch.where(found, duration, b.duration))
            b.frame.add_(torch.where(moves, duration.clamp(min=1), 0))
        b.symbols.masked_fill_(moves, 0)
        torch.lt(b.frame, b.lens, out=b.active)
        b.need.copy_(moves & b.active)
        if b.visited is not None:
            b.visited.add_(b.need.long())

    def _outer_step(self, b: _Buffers) -> None:
        """Rows that found a label: record it, advance the predictor (and the biasing node,
        and the LM states and scores), count it against the frame's limit."""
        slots = b.labels.size(1)
        ready = b.active & ~b.need
        slot = torch.where(ready, b.count, slots - 1)[:, None]  # the last slot is scratch
        b.labels.scatter_(1, slot, b.label[:, None])
        b.frames.scatter_(1, slot, b.frame[:, None])
        b.confidences.scatter_(1, slot, b.confidence[:, None])
        b.count.add_(ready.long())
        state = HypothesisState(b.pred, b.state, b.node, b.frame, b.lm_states, b.lm_scores)
        lm = None if b.lm_states is None else self.lm
        state = state.where(ready, state.after(self.model, b.label, b.biasing_next, lm))
        # (its `skip`, b.frame here, is neither read nor written back)
        b.pred.copy_(state.pred)
        copy_rows_into(b.state, state.predictor)
        b.node.copy_(state.biasing_node)
        if lm is not None:
            b.lm_states.copy_(state.lm_states)
            b.lm_scores.copy_(state.lm_scores)
        stays = ready
        if b.duration_frames is not None:  # a label moves on its duration (0: stays)
            b.durations.scatter_(1, slot, b.duration[:, None])
            jumps = torch.where(ready, b.duration, 0)
            b.frame.add_(jumps)
            stays = ready & (jumps == 0)
            b.symbols.masked_fill_(jumps > 0, 0)
        b.symbols.add_(stays.long())
        full = stays & (b.symbols >= self.options.max_symbols_per_frame)
        b.frame.add_(full.long())
        b.symbols.masked_fill_(full, 0)
        torch.lt(b.frame, b.lens, out=b.active)
        if b.visited is not None:  # rows that moved to a frame of theirs
            b.visited.add_(((ready & ~stays) | full).long() * b.active.long())
        b.need.copy_(b.need | (ready & b.active))

    def _fused_step(self, b: _Buffers) -> None:
        """One inner step, then the outer step of the rows that found their label: the
        graph's body. With nothing left to do it changes nothing."""
        self._inner_step(b)
        self._outer_step(b)

    def _eager_loops(self, b: _Buffers) -> None:
        while True:
            while bool(b.need.any()):
                self._inner_step(b)
            if not bool(b.active.any()):
                return
            self._outer_step(b)

    def _results(
        self, b: _Buffers, progress: GreedyProgress, encoder_lens: Tensor
    ) -> GreedyProgress:
        """`progress` after the chunk: the first rows' states (copied out of the buffers)
        and what each emitted."""
        batch = len(progress.consumed)
        counts = b.count[:batch].tolist()
        width = max(counts)
        labels = b.labels[:batch, :width].cpu().tolist()
        frames = b.frames[:batch, :width].cpu().tolist()
        sure = b.confidences[:batch, :width].cpu().tolist()
        lasting = [[1] * width for _ in range(batch)]  # a plain transducer's: one frame
        if b.durations is not None:
            lasting = b.durations[:batch, :width].cpu().tolist()
        emitted = [
            list(zip(labels[i][:n], frames[i][:n], sure[i][:n], lasting[i][:n], strict=True))
            for i, n in enumerate(counts)
        ]
        first = torch.arange(batch, device=b.pred.device)
        skip = progress.rows.skip
        if b.visited is not None:  # where each row's last duration took it past the chunk
            skip = b.frame[:batch] - b.lens[:batch]
        lm_states = lm_scores = None
        if b.lm_states is not None:
            lm_states, lm_scores = b.lm_states[:batch].clone(), b.lm_scores[:batch].clone()
        rows = HypothesisState(
            b.pred[:batch].clone(),
            take_rows(b.state, first),
            b.node[:batch].clone(),
            skip,
            lm_states,
            lm_scores,
        )
        visited = None if b.visited is None else b.visited[:batch].tolist()
        return progress.extended(rows, emitted, encoder_lens.tolist(), visited)
