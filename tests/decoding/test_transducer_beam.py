"""Beam search of transducers: beam 1 is greedy search, batching changes nothing, and
without pruning it finds what an exhaustive search over all alignments finds (with one
token per frame: modified beam search), each token sequence scored by the log-sum of its
alignments."""

import itertools
import math

import pytest
import torch
from torch import nn

from asr.decoding.search import decode, decode_nbest
from asr.decoding.transducer import GreedyOptions
from asr.decoding.transducer_beam import BeamOptions
from asr.models.transducer import Joiner, Predictor, PredictorConfig, Transducer
from tests.decoding.searching import beam_nbest, greedy_timed, greedy_tokens


def _random_model(vocab: int, kind: str = "lstm", seed: int = 0) -> Transducer:
    torch.manual_seed(seed)
    config = PredictorConfig(embed_dim=8, hidden_dim=10, kind=kind, context_size=2)
    predictor = Predictor(config, vocab_size=vocab)
    joiner = Joiner(encoder_dim=6, predictor_dim=10, joint_dim=12, vocab_size=vocab)
    return Transducer(nn.Identity(), predictor, joiner).double().eval()


@pytest.mark.parametrize("kind", ["lstm", "stateless"])
@pytest.mark.parametrize("symbols", [1, 2, 3])
def test_beam_one_is_greedy_search(kind: str, symbols: int) -> None:
    model = _random_model(9, kind)
    enc = 3 * torch.randn(5, 14, 6, dtype=torch.float64)
    lens = torch.tensor([14, 7, 1, 10, 0])
    greedy = greedy_tokens(model, enc, lens, GreedyOptions(max_symbols_per_frame=symbols))
    beam = beam_nbest(model, enc, lens, BeamOptions(beam_size=1, max_symbols_per_frame=symbols))
    assert [list(hyps[0].tokens) for hyps in beam] == greedy
    assert sum(map(len, greedy)) > 10  # the random model does emit tokens


@pytest.mark.parametrize("kind", ["lstm", "stateless"])
def test_batched_equals_one_by_one(kind: str) -> None:
    model = _random_model(9, kind, seed=1)
    enc = 3 * torch.randn(4, 12, 6, dtype=torch.float64)
    lens = torch.tensor([12, 5, 9, 1])
    options = BeamOptions(beam_size=4, nbest=4)
    batched = beam_nbest(model, enc, lens, options)
    for i, n in enumerate(lens.tolist()):
        alone = beam_nbest(model, enc[i : i + 1, :n], lens[i : i + 1], options)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in batched[i]]
        assert [h.score for h in alone] == pytest.approx([h.score for h in batched[i]], abs=1e-9)
    assert all(len(hyps) == 4 for hyps in batched[:3])  # enough distinct sequences
    assert all(h.score <= 0 for hyps in batched for h in hyps)
    scores = [h.score for h in batched[0]]
    assert scores == sorted(scores, reverse=True)


def _frame_choices(vocab: int, blank: int, symbols: int) -> list[tuple[int, ...]]:
    """What one frame may emit: up to `symbols` - 1 tokens then blank, or `symbols` tokens
    (the frame then ends without a blank)."""
    tokens = [v for v in range(vocab) if v != blank]
    choices = []
    for n in range(symbols):
        choices += [(*seq, blank) for seq in itertools.product(tokens, repeat=n)]
    return choices + list(itertools.product(tokens, repeat=symbols))


def _exhaustive(model: Transducer, enc: torch.Tensor, symbols: int) -> dict[tuple, float]:
    """Every token sequence reachable with at most `symbols` tokens per frame, with the
    log-sum of the probabilities of its alignments."""
    frames, blank = enc.size(0), model.blank_id
    choices = _frame_choices(model.vocab_size, blank, symbols)
    totals: dict[tuple[int, ...], float] = {}
    for path in itertools.product(choices, repeat=frames):
        state = model.predictor.init_state(1, "cpu")
        out, state = model.predictor.step(torch.tensor([blank]), state)
        score, seq = 0.0, ()
        for t, emitted in enumerate(path):
            for symbol in emitted:
                logits = model.joiner(enc[t : t + 1], out)
                score += float(logits.log_softmax(-1)[0, symbol])
                if symbol != blank:
                    seq = (*seq, symbol)
                    out, state = model.predictor.step(torch.tensor([symbol]), state)
        totals[seq] = math.log(math.exp(totals.get(seq, -math.inf)) + math.exp(score))
    return totals


@pytest.mark.parametrize(("symbols", "frames", "sequences"), [(1, 4, 31), (2, 2, 31)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_unpruned_beam_finds_the_exhaustive_search_s_best(
    seed: int, symbols: int, frames: int, sequences: int
) -> None:
    # blank and two tokens; one token per frame over 4 frames (81 alignments), or two per
    # frame over 2 frames (49): 31 token sequences either way
    model = _random_model(3, seed=seed)
    enc = 2 * torch.randn(1, frames, 6, dtype=torch.float64)
    with torch.inference_mode():
        exhaustive = _exhaustive(model, enc[0], symbols)
    assert len(exhaustive) == sequences
    wide = BeamOptions(beam_size=100, max_symbols_per_frame=symbols, nbest=sequences)
    hyps = beam_nbest(model, enc, torch.tensor([frames]), wide)[0]
    best = max(exhaustive, key=exhaustive.__getitem__)
    assert hyps[0].tokens == best
    # every sequence, scored by the log-sum of its alignments (merged hypotheses)
    assert {h.tokens: pytest.approx(h.score, abs=1e-9) for h in hyps} == exhaustive
    assert math.isclose(sum(math.exp(h.score) for h in hyps), 1.0, rel_tol=1e-9)


def test_nbest_lists_start_with_the_best_and_go_down() -> None:
    model = _random_model(9, seed=4)
    enc = 3 * torch.randn(3, 10, 6, dtype=torch.float64)
    lens = torch.tensor([10, 6, 8])
    options = BeamOptions(beam_size=4)
    lists = decode_nbest(model, enc, lens, options, 3)
    assert [hyps[0][0] for hyps in lists] == decode(model, enc, lens, options)
    for hyps in lists:
        scores = [score for _, score in hyps]
        assert len(hyps) == 3 and scores == sorted(scores, reverse=True)
    with pytest.raises(ValueError, match="needs a beam search at least as wide"):
        decode_nbest(model, enc, lens, GreedyOptions(), 2)


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="beam_size"):
        BeamOptions(beam_size=0)
    with pytest.raises(ValueError, match="nbest"):
        BeamOptions(beam_size=2, nbest=3)
    with pytest.raises(ValueError, match="max_symbols_per_frame"):
        BeamOptions(max_symbols_per_frame=0)


@pytest.mark.parametrize("symbols", [1, 3])
def test_beam_hypotheses_carry_their_tokens_frames(symbols: int) -> None:
    from asr.decoding.search import decode_timed

    model = _random_model(9, "lstm", seed=2)
    enc = 3 * torch.randn(3, 16, 6, dtype=torch.float64)
    lens = torch.tensor([16, 9, 4])
    greedy = greedy_timed(model, enc, lens, GreedyOptions(max_symbols_per_frame=symbols))
    one = beam_nbest(model, enc, lens, BeamOptions(beam_size=1, max_symbols_per_frame=symbols))
    assert [list(h[0].frames) for h in one] == [g.frames for g in greedy]  # beam 1 is greedy
    options = BeamOptions(beam_size=4, max_symbols_per_frame=symbols, nbest=4)
    for hyps, n in zip(beam_nbest(model, enc, lens, options), lens.tolist(), strict=True):
        for hyp in hyps:
            assert len(hyp.frames) == len(hyp.tokens)
            assert list(hyp.frames) == sorted(hyp.frames) and all(0 <= f < n for f in hyp.frames)
            counts = [hyp.frames.count(f) for f in set(hyp.frames)]
            assert max(counts, default=0) <= symbols
    best = decode_timed(model, enc, lens, options)
    assert [b.tokens for b in best] == decode(model, enc, lens, options)
    assert sum(len(b.frames) for b in best) > 5
