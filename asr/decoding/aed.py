"""Attention encoder-decoder decoding: batched greedy search and batched beam search.

Legend: B utterances, K beam size, N rows (hypotheses) of the decoder, T frames,
V vocabulary. Both searches feed one token per row per step through the decoder's KV
cache, and drop an utterance's rows from the batch as soon as it is finished, so the
cost of a step follows the hypotheses still alive. Each utterance may emit at most
ceil(audio seconds x `max_tps`) tokens before EOS. Call ``model.eval()`` first.

Phrases to boost (`asr.decoding.biasing.BiasingGraph`) and a language model to fuse
(`asr.decoding.fusion.LmFusion`: shallow fusion, optionally less a LODR LM) enter the beam
search only (greedy search with either is the beam search of width 1). The LM's ``</s>`` is
the model's EOS, so the fused score of the EOS column is the score of the sentence's end:
it is counted once, when a hypothesis ends, as every other token's when it is appended.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from asr.decoding.biasing import BiasingGraph, keep_half
from asr.decoding.checks import check_beam, check_encoder_output
from asr.decoding.cuda_graphs import KeptBuffers, ModelRef, kept_with, run_steps
from asr.decoding.fusion import LmFusion
from asr.models.aed import DecoderState, EncoderDecoder, StaticDecoderState


@dataclass(frozen=True)
class AedSearchOptions:
    """beam_size: 1 is greedy search. length_penalty: a finished hypothesis scores
    S / (tokens + 1) ** length_penalty, S its log P plus its biasing bonus and its fused LM
    scores, the end's included (0: S itself; NeMo's AED beam search with NGPU-LM divides
    the same sum). max_tps: at most this many tokens per second of audio (bounds the
    output length). nbest: how many hypotheses an n-best list holds (best first)."""

    beam_size: int = 1
    length_penalty: float = 1.0
    max_tps: float = 25.0
    nbest: int = 1

    def __post_init__(self) -> None:
        check_beam(self.beam_size, self.nbest)
        if not self.max_tps > 0:
            raise ValueError(f"max_tps must be positive, got {self.max_tps}")


def max_output_lengths(encoder_lens: Tensor, frame_seconds: float, max_tps: float) -> Tensor:
    """The most tokens (EOS excluded) each utterance may emit: ceil(seconds x max_tps), >= 1."""
    seconds = encoder_lens.double() * frame_seconds
    return torch.ceil(seconds * max_tps).long().clamp(min=1)


def decode(
    model: EncoderDecoder,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    options: AedSearchOptions = AedSearchOptions(),
    biasing: BiasingGraph | None = None,
    lm: LmFusion | None = None,
) -> list[list[int]]:
    """Greedy search when `options.beam_size` is 1 (on CUDA: `StaticGreedySearch`, the
    same tokens replayed from a CUDA graph), else beam search; with `biasing` (phrases to
    boost) or `lm` (a language model to fuse), always beam search (of width 1: greedy
    search with the bonus and the LM's scores)."""
    if options.beam_size == 1 and biasing is None and lm is None:
        if encoder_out.is_cuda and isinstance(model, EncoderDecoder):
            return cached_static_search(model, options.max_tps)(encoder_out, encoder_lens)
        return greedy_search(model, encoder_out, encoder_lens, options.max_tps)
    return beam_search(model, encoder_out, encoder_lens, options, biasing, lm)


@torch.inference_mode()
def greedy_search(
    model: EncoderDecoder, encoder_out: Tensor, encoder_lens: Tensor, max_tps: float = 25.0
) -> list[list[int]]:
    """encoder_out (B, T, D), encoder_lens (B,) -> B token-id lists (no BOS/EOS)."""
    check_encoder_output(encoder_out, encoder_lens)
    batch, device = encoder_out.size(0), encoder_out.device
    results: list[list[int]] = [[] for _ in range(batch)]
    if batch == 0:
        return results
    limits = max_output_lengths(encoder_lens, model.frame_seconds, max_tps).tolist()
    state = model.decoder.init_state(encoder_out, encoder_lens)
    rows = list(range(batch))  # the utterance of each row still decoding
    tokens = torch.full((batch,), model.bos_id, dtype=torch.long, device=device)
    for step in range(max(limits) + 1):
        logits, state = model.decoder.step(tokens, state)
        best = logits.argmax(dim=-1)
        keep = []
        for i, (row, token) in enumerate(zip(rows, best.tolist(), strict=True)):
            if token != model.eos_id and step < limits[row]:
                results[row].append(token)
                keep.append(i)
        if not keep:
            break
        if len(keep) < len(rows):
            index = torch.tensor(keep, device=device)
            state, best = state.select(index), best.index_select(0, index)
            rows = [rows[i] for i in keep]
        tokens = best
    return results


@dataclass
class _GreedyBuffers:
    """A static greedy search's tensors: the decoder state, the token fed next `tokens`
    (N,), `done` (N,), each row's token limit `limits` (N,), `out` (N, L) the tokens
    chosen at each step and `count` (N,) how many of them are kept."""

    state: StaticDecoderState
    tokens: Tensor
    done: Tensor
    limits: Tensor
    out: Tensor
    count: Tensor


class StaticGreedySearch:
    """Greedy search with a preallocated self-attention cache: `search(encoder_out,
    encoder_lens)` -> B token-id lists, `greedy_search`'s tokens.

    Finished rows stay in the batch (their tokens are no longer kept), so every step is
    the same fixed-shape work over `StaticDecoderState`: on CUDA with `use_cuda_graphs`
    it is captured once and replayed, `REPLAYS_PER_CHECK` steps between checks for the
    end; buffers are kept for batches that fit them. Elsewhere it runs eagerly (slower
    than `greedy_search` on a CPU, which drops finished rows: its use there is its test).
    """

    def __init__(
        self, model: EncoderDecoder, max_tps: float = 25.0, use_cuda_graphs: bool = True
    ) -> None:
        if not max_tps > 0:
            raise ValueError(f"max_tps must be positive, got {max_tps}")
        self._model = ModelRef(model)
        self.max_tps, self.use_cuda_graphs = max_tps, use_cuda_graphs
        self.kept = KeptBuffers(self._step)

    @property
    def model(self) -> EncoderDecoder:
        return self._model()

    @torch.inference_mode()
    def __call__(self, encoder_out: Tensor, encoder_lens: Tensor) -> list[list[int]]:
        check_encoder_output(encoder_out, encoder_lens)
        batch, frames = encoder_out.size(0), encoder_out.size(1)
        if batch == 0:
            return []
        lens = encoder_lens.to(encoder_out.device)
        limits = max_output_lengths(lens, self.model.frame_seconds, self.max_tps)
        steps = int(limits.max()) + 1  # the last step can only end (EOS or the limit)
        b, step = self.kept.get(
            (batch, max(frames, 1), steps),
            (encoder_out.device, self.model.decoder.embedding.weight.dtype),
            lambda sizes: self._allocate(*sizes, encoder_out.device),
            encoder_out.device,
            self.use_cuda_graphs and encoder_out.is_cuda,
        )
        self.model.decoder.load_static_state(b.state, encoder_out, lens)
        b.tokens.fill_(self.model.bos_id)
        b.done.fill_(True)
        b.done[:batch] = False
        b.limits.zero_()
        b.limits[:batch].copy_(limits)
        b.count.zero_()
        run_steps(step, lambda: bool(b.done.all()), max_steps=steps)
        counts = b.count[:batch].tolist()
        out = b.out[:batch, : max(counts)].cpu().tolist()
        return [row[:n] for row, n in zip(out, counts, strict=True)]

    def _allocate(
        self, batch: int, frames: int, steps: int, device: torch.device
    ) -> _GreedyBuffers:
        dtype = self.model.decoder.embedding.weight.dtype
        state = self.model.decoder.static_state(batch, frames, steps, device, dtype)

        def longs(*shape: int) -> Tensor:
            return torch.zeros(shape, dtype=torch.long, device=device)

        done = torch.ones(batch, dtype=torch.bool, device=device)
        return _GreedyBuffers(
            state, longs(batch), done, longs(batch), longs(batch, steps), longs(batch)
        )

    def _step(self, b: _GreedyBuffers) -> None:
        """Feed one token per row; keep each unfinished row's best next token unless it is
        EOS or beyond the row's limit (then the row is done)."""
        logits = self.model.decoder.step_static(b.tokens, b.state)
        best = logits.argmax(dim=-1)
        index = b.state.position - 1  # this step's number, 0 first
        ends = b.done | (best == self.model.eos_id) | (index >= b.limits)
        b.out.index_copy_(1, index.view(1), best[:, None])
        b.count.add_((~ends).long())
        b.done.copy_(ends)
        b.tokens.copy_(best)


def cached_static_search(model: EncoderDecoder, max_tps: float) -> StaticGreedySearch:
    """The model's `StaticGreedySearch` for `max_tps`, kept with the model so that its
    buffers and CUDA graph serve every batch that fits them."""
    return kept_with(
        model, (StaticGreedySearch, max_tps), lambda: StaticGreedySearch(model, max_tps)
    )


@torch.inference_mode()
def beam_search(
    model: EncoderDecoder,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    options: AedSearchOptions = AedSearchOptions(beam_size=4),
    biasing: BiasingGraph | None = None,
    lm: LmFusion | None = None,
) -> list[list[int]]:
    """encoder_out (B, T, D), encoder_lens (B,) -> the best hypothesis of each utterance
    (see `beam_search_nbest`)."""
    nbest = beam_search_nbest(model, encoder_out, encoder_lens, options, biasing, lm)
    return [hyps[0][0] if hyps else [] for hyps in nbest]


@torch.inference_mode()
def beam_search_nbest(
    model: EncoderDecoder,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    options: AedSearchOptions = AedSearchOptions(beam_size=4),
    biasing: BiasingGraph | None = None,
    lm: LmFusion | None = None,
) -> list[list[tuple[list[int], float]]]:
    """encoder_out (B, T, D), encoder_lens (B,) -> per utterance its `options.nbest` best
    finished hypotheses as (tokens, score), best first: the score is the length-penalized
    log-probability, with the biasing bonus and the fused LM scores where given.

    Each step expands every live hypothesis by every token and keeps the 2K best
    candidates of each utterance: EOS candidates among the first K end a hypothesis
    (scored with the length penalty), the first K others go on. An utterance stops when
    it has K finished hypotheses, or at its length limit, where only EOS is allowed.
    With K = 1 this is exactly greedy search (with the bonus and the LM scores, if any).

    With `biasing`, every token adds its gain in the graph (`BiasingGraph.gain`) to the
    hypothesis's score; EOS, which matches no phrase, gives back what a partial match
    holds. Finished scores include the bonus. Half the hypotheses that go on are the best
    as if every partial match ended (`_plain_half`: `biasing.keep_half`, the transducer
    beam's rule).

    With `lm`, every token adds its fused score (`LmFusion.scores`: lm_weight x ln P_lm
    less lodr_weight x ln P_lodr, given the hypothesis's tokens after ``<s>``); each
    hypothesis carries its LM states, re-ranked with it as its decoder cache is. EOS is the
    LM's ``</s>``: its column is the end-of-sentence score, added once, when the hypothesis
    ends. With both, the bonus and the LM score add. Finished scores are (log P + bonus +
    LM scores) / (tokens + 1) ** length_penalty: the LM is part of the sum the length
    penalty divides (NeMo's AED beam with NGPU-LM does the same). An LM that leaves few
    tokens likely (one trained on little text) makes early EOS candidates fill the K
    finished places sooner, and the search can stop before a longer, better hypothesis
    ends: a wider beam finds it.
    """
    check_encoder_output(encoder_out, encoder_lens)
    k, eos = options.beam_size, model.eos_id
    batch, device = encoder_out.size(0), encoder_out.device
    if batch == 0:
        return []
    if biasing is not None:
        biasing = biasing.to(device)
    if lm is not None:  # an attention decoder's vocabulary has no blank: every token scored
        lm = lm.for_model(model.vocab_size, None, device)
    beam = _start_beam(model, encoder_out, encoder_lens, options, lm)
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
    for step in range(int(beam.limits.max()) + 1):
        logits, beam.state = model.decoder.step(beam.tokens, beam.state)
        candidates, at_limit = _step_candidates(beam, logits, step, eos, biasing, lm)
        b, _, vocab = candidates.shape
        top_scores, top = candidates.view(b, k * vocab).topk(min(2 * k, k * vocab), dim=-1)
        is_eos = top % vocab == eos  # (b, 2K)
        _finish_ends(beam, top_scores, top // vocab, is_eos, step, options, finished)
        # The first K candidates that are not EOS go on (at least K exist among 2K).
        rank = torch.arange(top.size(1), device=device)
        order = (is_eos.long() * top.size(1) + rank).argsort(dim=-1)[:, :k]  # (b, K)
        chosen = top.gather(1, order)  # row of the utterance * V + token
        if biasing is not None:
            chosen = _plain_half(candidates, chosen, biasing, beam.nodes, eos)
        done = [
            len(finished[u]) >= k or end
            for u, end in zip(beam.utts, at_limit.tolist(), strict=True)
        ]
        if all(done):
            break
        beam = _carry(beam, candidates, chosen, done, biasing, lm)
    return [
        [(tokens, score) for score, tokens in sorted(hyps, key=lambda h: -h[0])][: options.nbest]
        for hyps in finished
    ]


@dataclass
class _Beam:
    """The live hypotheses of the b utterances still decoding, K rows each (N = b x K):
    `utts` the utterance of each group of K rows, `limits` (b,) their token limits,
    `state` the decoder's cache (N rows), `tokens` (N,) the token each row feeds next,
    `scores` (b, K) their scores, `history` (N, steps) their tokens so far, `nodes` (N,)
    their places in the biasing graph and `lm_states` (N, P) their states in the P LMs
    (P = 0 without an LM)."""

    utts: list[int]
    limits: Tensor
    state: DecoderState
    tokens: Tensor
    scores: Tensor
    history: Tensor
    nodes: Tensor
    lm_states: Tensor


def _start_beam(
    model: EncoderDecoder,
    encoder_out: Tensor,
    encoder_lens: Tensor,
    options: AedSearchOptions,
    lm: LmFusion | None,
) -> _Beam:
    """K rows per utterance, one live hypothesis (``<s>``) each; the copies score -inf."""
    k, batch, device = options.beam_size, encoder_out.size(0), encoder_out.device
    limits = max_output_lengths(encoder_lens, model.frame_seconds, options.max_tps)
    expand = torch.arange(batch, device=device).repeat_interleave(k)
    state = model.decoder.init_state(encoder_out, encoder_lens).select(expand)
    scores = torch.full((batch, k), -math.inf, device=device)
    scores[:, 0] = 0.0
    lm_states = torch.zeros((batch * k, 0), dtype=torch.long, device=device)
    if lm is not None:
        lm_states = lm.start(batch * k, device)
    return _Beam(
        utts=list(range(batch)),
        limits=limits.to(device),
        state=state,
        tokens=torch.full((batch * k,), model.bos_id, dtype=torch.long, device=device),
        scores=scores,
        history=torch.empty((batch * k, 0), dtype=torch.long, device=device),
        nodes=torch.zeros(batch * k, dtype=torch.long, device=device),
        lm_states=lm_states,
    )


def _step_candidates(
    beam: _Beam,
    logits: Tensor,
    step: int,
    eos: int,
    biasing: BiasingGraph | None,
    lm: LmFusion | None,
) -> tuple[Tensor, Tensor]:
    """Every row's score plus each token's: log P, the biasing gain, the fused LM score
    (EOS's column: the end of the sentence) -> candidates (b, K, V) and `at_limit` (b,),
    the utterances at their length limit, where only EOS may follow."""
    b, k, vocab = beam.scores.size(0), beam.scores.size(1), logits.size(-1)
    log_probs = torch.log_softmax(logits.float(), dim=-1).view(b, k, vocab)
    candidates = beam.scores[:, :, None] + log_probs
    if biasing is not None:
        candidates = candidates + biasing.gain.index_select(0, beam.nodes).view(b, k, vocab)
    if lm is not None:
        candidates = candidates + lm.scores(beam.lm_states).view(b, k, vocab)
    at_limit = step >= beam.limits
    if bool(at_limit.any()):
        only_eos = torch.full_like(candidates[0, 0], -math.inf)
        only_eos[eos] = 0.0
        candidates = torch.where(at_limit[:, None, None], candidates + only_eos, candidates)
    return candidates, at_limit


def _finish_ends(
    beam: _Beam,
    top_scores: Tensor,
    top_beam: Tensor,
    is_eos: Tensor,
    step: int,
    options: AedSearchOptions,
    finished: list[list[tuple[float, list[int]]]],
) -> None:
    """The finite EOS candidates among each utterance's first K (of `top_scores` (b, 2K),
    from rows `top_beam`) end their hypotheses: each is added to `finished` with its
    length-penalized score while its utterance has fewer than K."""
    k = options.beam_size
    rank = torch.arange(top_scores.size(1), device=top_scores.device)
    ends = is_eos & (rank < k) & torch.isfinite(top_scores)
    if not bool(ends.any()):
        return
    penalty = float(step + 1) ** options.length_penalty
    for g, c in ends.nonzero().tolist():
        utt = beam.utts[g]
        if len(finished[utt]) < k:
            prefix = beam.history[g * k + int(top_beam[g, c])].tolist()
            finished[utt].append((float(top_scores[g, c]) / penalty, prefix))


def _carry(
    beam: _Beam,
    candidates: Tensor,
    chosen: Tensor,
    done: list[bool],
    biasing: BiasingGraph | None,
    lm: LmFusion | None,
) -> _Beam:
    """The next beam: the `chosen` (b, K) places (row of the utterance * V + token) of the
    utterances not `done`, each carrying its source row's decoder cache, history, biasing
    node and LM states, advanced by its token; the `done` utterances leave the batch."""
    b, k, vocab = candidates.shape
    device = chosen.device
    scores = candidates.view(b, -1).gather(1, chosen)
    source = chosen // vocab + torch.arange(b, device=device)[:, None] * k
    new_tokens = chosen % vocab
    utts, limits = beam.utts, beam.limits
    keep = [g for g, d in enumerate(done) if not d]
    if len(keep) < b:  # finished utterances leave the batch
        source, new_tokens, scores = source[keep], new_tokens[keep], scores[keep]
        limits = limits.index_select(0, torch.tensor(keep, device=device))
        utts = [utts[g] for g in keep]
        state = beam.state.select(source.reshape(-1))
    else:  # hypotheses only move between the rows of their own utterance
        state = beam.state.select(source.reshape(-1), same_memory=True)
    rows, tokens = source.reshape(-1), new_tokens.reshape(-1)
    history = torch.cat([beam.history.index_select(0, rows), tokens[:, None]], dim=1)
    nodes, lm_states = beam.nodes, beam.lm_states
    if biasing is not None:
        nodes = biasing.next[nodes.index_select(0, rows), tokens]
    if lm is not None:
        lm_states = lm.step(lm_states.index_select(0, rows), tokens)
    return _Beam(utts, limits, state, tokens, scores, history, nodes, lm_states)


def _plain_half(
    candidates: Tensor, chosen: Tensor, biasing: BiasingGraph, nodes: Tensor, eos: int
) -> Tensor:
    """The K places (row * V + token) that go on (`keep_half`): the best half of `chosen`
    (the K best by score), the rest the best by score less what their state would give
    back if the hypothesis ended there (`BiasingGraph.held`), so that a failed partial
    match finds the plain hypotheses still in the beam."""
    b, k, vocab = candidates.shape
    held = biasing.held[biasing.next[nodes]].view(b, k * vocab)
    plain = candidates.view(b, -1) - held
    plain.view(b, k, vocab)[:, :, eos] = -math.inf  # EOS ends a hypothesis: it goes nowhere
    plain_best, plain_at = plain.topk(k, dim=-1)
    kept = [
        keep_half(by_score, [f for f, v in zip(at, value, strict=True) if v > -math.inf], k)
        for by_score, at, value in zip(
            chosen.tolist(), plain_at.tolist(), plain_best.tolist(), strict=True
        )
    ]
    return torch.tensor(kept, device=chosen.device)
