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
to t + 1 (a guard against a joiner that never emits blank).

A context graph (`asr.decoding.biasing`, phrases to boost) is read the same way: its
tables are copied into static buffers of the search (`biased=True`, at least as many
states), each row keeps its state, and the inner step adds what each token earns to the
log-probabilities, as the frame-looping search does: the same tokens again.

Legend: B batch, T frames, D joint width, S = T x max_symbols_per_frame + 1 label slots,
N context states, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from asr.decoding.biasing import ContextGraph
from asr.decoding.checks import check_encoder_output
from asr.decoding.confidence import token_confidence
from asr.decoding.cuda_graphs import KeptBuffers, ModelRef, kept_with, run_steps
from asr.decoding.transducer import GreedyOptions, TimedTokens, _select
from asr.models.transducer import PredictorState, Transducer


def _copy_state(target: PredictorState, source: PredictorState) -> None:
    """Copy a batch-first predictor state into `target`'s tensors, in place."""
    if isinstance(target, Tensor):
        target.copy_(source)
        return
    for t, s in zip(target, source, strict=True):
        _copy_state(t, s)


def _empty_like_state(state: PredictorState, rows: int) -> PredictorState:
    """Zeros of `state`'s shape with `rows` rows."""
    if isinstance(state, Tensor):
        return state.new_zeros((rows, *state.shape[1:]))
    return tuple(_empty_like_state(s, rows) for s in state)


@dataclass
class _Buffers:
    """Everything a search step reads or writes, allocated once for B rows and T frames.

    `enc` (B, T, D) projected encoder output; `lens` (B,) valid frames (0 on unused rows);
    `frame` (B,) each row's current frame; `symbols` (B,) labels emitted at it; `label`
    (B,) the label found by the inner loop; `need` (B,) still looking for a label;
    `active` (B,) frames left; `pred` (B, D) projected predictor output and `state` the
    predictor state after each row's last label; `labels`, `frames`, `confidences`
    (B, S) what was emitted, where and how surely; `count` (B,) how many; `confidence`
    (B,) that of the label found by the inner loop. A biased search also has `node` (B,)
    each row's context state and the graph's tables `context_next`, `context_advance`
    (N, V); None otherwise.
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
    node: Tensor | None = None
    context_next: Tensor | None = None
    context_advance: Tensor | None = None

    @property
    def capacity(self) -> tuple[int, int]:
        return self.enc.size(0), self.enc.size(1)


class LabelLoopingGreedy:
    """`search(encoder_out, encoder_lens)` -> per utterance its tokens and their frames.

    `use_cuda_graphs`: on CUDA, capture the fused step (one inner step, then the outer
    step of the rows that found a label) and replay it, `REPLAYS_PER_CHECK` times between
    checks; buffers are kept and reused for batches that fit (`KeptBuffers`). Elsewhere,
    or with False, the steps run eagerly: inner steps until every row has found its label,
    then one outer step (fewest predictor calls). `biased`: every call passes a
    `ContextGraph` (its own search and graph: an unbiased search keeps its exact steps).
    """

    def __init__(
        self,
        model: Transducer,
        options: GreedyOptions = GreedyOptions(),
        use_cuda_graphs: bool = True,
        biased: bool = False,
    ) -> None:
        if options.max_symbols_per_frame < 1:
            raise ValueError(
                f"max_symbols_per_frame must be >= 1, got {options.max_symbols_per_frame}"
            )
        self._model = ModelRef(model)
        self.options, self.use_cuda_graphs, self.biased = options, use_cuda_graphs, biased
        self.kept = KeptBuffers(self._fused_step)

    @property
    def model(self) -> Transducer:
        return self._model()

    def __call__(
        self, encoder_out: Tensor, encoder_lens: Tensor, context: ContextGraph | None = None
    ) -> list[TimedTokens]:
        graphs = self.use_cuda_graphs and encoder_out.device.type == "cuda"
        return self._decode(encoder_out, encoder_lens, fused=graphs, context=context)

    @torch.inference_mode()
    def _decode(
        self,
        encoder_out: Tensor,
        encoder_lens: Tensor,
        fused: bool,
        context: ContextGraph | None = None,
    ) -> list[TimedTokens]:
        """`fused`: the graph's loop (replayed on CUDA with graphs, its body run eagerly
        elsewhere: how a CPU tests it), else the eager loops."""
        check_encoder_output(encoder_out, encoder_lens)
        if self.biased != (context is not None):
            raise ValueError(
                "a biased search decodes with a context graph, an unbiased one without: "
                "use cached_search(model, options, biased=context is not None)"
            )
        batch, frames = encoder_out.size(0), encoder_out.size(1)
        if batch == 0:
            return []
        if frames == 0:
            return [TimedTokens([], [], []) for _ in range(batch)]
        enc = self.model.joiner.project_encoder(encoder_out)
        graphs = self.use_cuda_graphs and enc.device.type == "cuda"
        sizes = (batch, frames) if context is None else (batch, frames, context.num_states)
        buffers, step = self.kept.get(
            sizes,
            (enc.device, enc.dtype),
            lambda sizes: self._allocate(enc, *sizes),
            enc.device,
            graphs,
        )
        self._reset(buffers, enc, encoder_lens, context)
        if fused:
            run_steps(step, lambda: not bool(buffers.active.any()))
        else:
            self._eager_loops(buffers)
        return self._results(buffers, batch)

    # -- buffers ----------------------------------------------------------------------

    def _allocate(self, enc: Tensor, batch: int, frames: int, states: int = 0) -> _Buffers:
        device, slots = enc.device, frames * self.options.max_symbols_per_frame + 1
        predictor, joiner, blank = self.model.predictor, self.model.joiner, self.model.blank_id
        blanks = torch.full((batch,), blank, dtype=torch.long, device=device)
        out, state = predictor.step(blanks, predictor.init_state(batch, device))
        pred = joiner.project_predictor(out)

        def longs(*shape: int) -> Tensor:
            return torch.zeros(shape, dtype=torch.long, device=device)

        def flags() -> Tensor:
            return torch.zeros(batch, dtype=torch.bool, device=device)

        vocab = joiner.vocab_size
        biased = {}
        if self.biased:
            biased = {
                "node": longs(batch),
                "context_next": longs(states, vocab),
                "context_advance": torch.zeros(states, vocab, device=device),
            }
        return _Buffers(
            enc=enc.new_zeros((batch, frames, enc.size(2))),
            lens=longs(batch),
            rows=torch.arange(batch, device=device),
            frame=longs(batch),
            symbols=longs(batch),
            label=torch.full_like(blanks, blank),
            need=flags(),
            active=flags(),
            pred=torch.zeros_like(pred),
            state=_empty_like_state(state, batch),
            labels=longs(batch, slots),
            frames=longs(batch, slots),
            confidences=torch.zeros(batch, slots, device=device),
            count=longs(batch),
            confidence=torch.zeros(batch, device=device),
            **biased,
        )

    def _reset(
        self, b: _Buffers, enc: Tensor, encoder_lens: Tensor, context: ContextGraph | None
    ) -> None:
        """The state before the first frame, for the utterances of `enc` in the first rows
        (and `context`'s tables in the first rows of the biased search's)."""
        batch, frames = enc.size(0), enc.size(1)
        rows = b.capacity[0]
        predictor, joiner, blank = self.model.predictor, self.model.joiner, self.model.blank_id
        b.enc[:batch, :frames].copy_(enc)
        b.lens.zero_()
        b.lens[:batch].copy_(encoder_lens.to(enc.device))
        for t in (b.frame, b.symbols, b.count):
            t.zero_()
        b.label.fill_(blank)
        blanks = torch.full((rows,), blank, dtype=torch.long, device=enc.device)
        out, state = predictor.step(blanks, predictor.init_state(rows, enc.device))
        b.pred.copy_(joiner.project_predictor(out))
        _copy_state(b.state, state)
        torch.lt(b.frame, b.lens, out=b.active)
        b.need.copy_(b.active)
        if context is not None:
            context = context.to(enc.device)
            states = context.num_states
            b.node.zero_()
            b.context_next.zero_()
            b.context_advance.zero_()
            b.context_next[:states].copy_(context.next)
            b.context_advance[:states].copy_(context.advance)

    # -- the steps ----------------------------------------------------------------------

    def _inner_step(self, b: _Buffers) -> None:
        """Rows looking for a label: the joiner at their frame; a blank moves them on."""
        last = b.enc.size(1) - 1
        enc = b.enc[b.rows, b.frame.clamp(max=last)]  # (B, D)
        logits = self.model.joiner.joint(enc, b.pred)
        log_probs = logits.float().log_softmax(dim=-1)
        if b.node is None:
            best = logits.argmax(dim=-1)
        else:
            best = (log_probs + b.context_advance.index_select(0, b.node)).argmax(dim=-1)
        is_blank = best == self.model.blank_id
        moves = b.need & is_blank
        found = b.need & ~is_blank
        b.label.copy_(torch.where(found, best, b.label))
        b.confidence.copy_(torch.where(found, token_confidence(log_probs), b.confidence))
        b.frame.add_(moves.long())
        b.symbols.masked_fill_(moves, 0)
        torch.lt(b.frame, b.lens, out=b.active)
        b.need.copy_(moves & b.active)

    def _outer_step(self, b: _Buffers) -> None:
        """Rows that found a label: record it, advance the predictor, count it against
        the frame's limit."""
        model, slots = self.model, b.labels.size(1)
        ready = b.active & ~b.need
        slot = torch.where(ready, b.count, slots - 1)[:, None]  # the last slot is scratch
        b.labels.scatter_(1, slot, b.label[:, None])
        b.frames.scatter_(1, slot, b.frame[:, None])
        b.confidences.scatter_(1, slot, b.confidence[:, None])
        b.count.add_(ready.long())
        if b.node is not None:
            b.node.copy_(torch.where(ready, b.context_next[b.node, b.label], b.node))
        out, state = model.predictor.step(b.label, b.state)
        _copy_state(b.state, _select(ready, state, b.state))
        b.pred.copy_(torch.where(ready[:, None], model.joiner.project_predictor(out), b.pred))
        b.symbols.add_(ready.long())
        full = ready & (b.symbols >= self.options.max_symbols_per_frame)
        b.frame.add_(full.long())
        b.symbols.masked_fill_(full, 0)
        torch.lt(b.frame, b.lens, out=b.active)
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

    def _results(self, b: _Buffers, batch: int) -> list[TimedTokens]:
        counts = b.count[:batch].tolist()
        width = max(counts)
        labels = b.labels[:batch, :width].cpu().tolist()
        frames = b.frames[:batch, :width].cpu().tolist()
        sure = b.confidences[:batch, :width].cpu().tolist()
        return [
            TimedTokens(labels[i][:n], frames[i][:n], sure[i][:n]) for i, n in enumerate(counts)
        ]


def cached_search(
    model: Transducer, options: GreedyOptions, biased: bool = False
) -> LabelLoopingGreedy:
    """The model's label-looping search for `options` (`biased`: one that takes a context
    graph), kept with the model so that its buffers and CUDA graph serve every batch that
    fits them."""
    return kept_with(
        model,
        (LabelLoopingGreedy, options, biased),
        lambda: LabelLoopingGreedy(model, options, biased=biased),
    )
