"""Language-model fusion in the transducer searches: the tensor form of an n-gram against its
ARPA file, weight 0 and LODR with equal LMs changing nothing, a hand-built LM making greedy
and beam search pick a token they miss without it, LM and biasing scores adding, the end
of the sentence scored once, and bad input refused in one line."""

import math
import random

import pytest
import torch

from asr.decoding.biasing import BiasingGraph
from asr.decoding.fusion import MAX_LM_WEIGHT, LmFusion, TokenLm, check_lm_weight, load_fusion
from asr.decoding.kneser_ney import KneserNeyCounter, train_kneser_ney
from asr.decoding.lm import read_arpa, write_arpa
from asr.decoding.transducer import FrameLoopingGreedy, GreedyOptions
from asr.decoding.transducer_beam import BeamOptions, BeamSearch
from tests.decoding.searching import beam_nbest, greedy_timed
from tests.decoding.test_biasing import FRAMES, LENS, ONE, V, _hand_model
from tests.decoding.test_transducer_beam import _random_model

SPECIAL = ["<blk>", "<unk>", "<s>", "</s>"]


def pieces_of(vocab: int) -> list[str]:
    """A vocabulary: ids 0-3 special (as `asr.tokens`), text tokens "t4", "t5", ..."""
    return SPECIAL + [f"t{i}" for i in range(4, vocab)]


def lm_of(sentences: list[list[int]], order: int, vocab: int) -> TokenLm:
    pieces = pieces_of(vocab)
    return TokenLm.from_ngram(train_kneser_ney(sentences, order, pieces.__getitem__), pieces)


def random_sentences(vocab: int, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    # a skewed, repetitive text, so that every order has n-grams seen more than once
    return [
        [min(4 + int(rng.expovariate(0.6)), vocab - 1) for _ in range(rng.randint(1, 9))]
        for _ in range(count)
    ]


# -- the tensor form ----------------------------------------------------------------------
@pytest.mark.parametrize("order", [2, 3, 4, 6])
def test_the_tensor_form_gives_the_arpa_file_s_probabilities(order, tmp_path):
    """Every token after random histories: the tensor form's ln p equals the back-off
    query of the ARPA file it was written to and read back from, and stepping token by
    token lands in the state of the longest history the file knows."""
    vocab = 12
    pieces = pieces_of(vocab)
    path = tmp_path / "lm.arpa.gz"
    write_arpa(
        train_kneser_ney(random_sentences(vocab, 300, order), order, pieces.__getitem__), path
    )
    arpa = read_arpa(path)
    lm = TokenLm.from_ngram(arpa, pieces)
    rng = random.Random(1)
    for _ in range(40):
        history = [rng.randrange(4, vocab) for _ in range(rng.randrange(0, 7))]
        state = torch.tensor([lm.start_state])
        for token in history:
            state = lm.step(state, torch.tensor([token]))
        scores = lm.all_scores(state)[0]
        context = ["<s>"] + [pieces[t] for t in history]
        for token in range(1, vocab):  # <unk>, <s> (-99), </s> and the text tokens
            expected = arpa.log10_prob(context, pieces[token]) * math.log(10)
            assert float(scores[token]) == pytest.approx(expected, abs=2e-5)
    sentence = [5, 4, 4, 6]
    context, total = ["<s>"], 0.0
    for token in [*map(pieces.__getitem__, sentence), "</s>"]:
        total += arpa.log10_prob(context, token) * math.log(10)
        context.append(token)
    assert lm.log_prob(sentence) == pytest.approx(total, abs=1e-4)


def test_a_model_token_the_lm_never_saw_gets_unk_and_blank_gets_nothing():
    lm = lm_of([[4, 5], [5, 4]], 2, 8)  # t6, t7 unseen
    fusion = LmFusion(lm, 0.5).for_model(8, 0, "cpu")
    scores = fusion.scores(fusion.start(2, "cpu"))
    unk = float(lm.all_scores(torch.tensor([lm.start_state]))[0, 1])
    assert float(scores[0, 6]) == pytest.approx(0.5 * unk)
    assert float(scores[0, 7]) == pytest.approx(0.5 * unk)
    assert float(scores[0, 0]) == 0.0  # blank: never scored
    assert unk < float(scores[0, 4]) / 0.5  # a seen token is likelier


def test_the_tensor_form_is_saved_beside_the_arpa_file_and_reused(tmp_path):
    pieces = pieces_of(9)
    path = tmp_path / "lm.arpa"
    write_arpa(train_kneser_ney(random_sentences(9, 50, 0), 3, pieces.__getitem__), path)
    first = load_fusion(pieces, path, 0.3)
    caches = list(tmp_path.glob("lm.arpa.*.pt"))
    assert len(caches) == 1
    again = load_fusion(pieces, caches[0], 0.3)  # the cache itself loads too
    assert torch.equal(first.lm.keys, again.lm.keys)
    assert torch.equal(first.lm.arc_logp, again.lm.arc_logp)
    with pytest.raises(ValueError, match="another vocabulary"):
        load_fusion(pieces_of(10), caches[0], 0.3)


# -- searches --------------------------------------------------------------------------------
def _searches(model, enc, lens, lm=None, biasing=None, symbols=3):
    greedy = greedy_timed(model, enc, lens, GreedyOptions(symbols), biasing, lm)
    beam = beam_nbest(model, enc, lens, BeamOptions(4, symbols, nbest=4), biasing, lm)
    return greedy, beam


@pytest.mark.parametrize("symbols", [1, 3])
def test_weight_zero_and_equal_lodr_change_nothing(symbols):
    """`--lm-weight 0`, and LODR with the LM itself at the LM's weight, give exactly what no
    LM gives: tokens, frames, confidences, n-best lists and scores."""
    model = _random_model(9)
    torch.manual_seed(3)
    enc = 3 * torch.randn(4, 12, 6, dtype=torch.float64)
    lens = torch.tensor([12, 7, 1, 10])
    lm = lm_of(random_sentences(9, 200, 0), 3, 9)
    plain = _searches(model, enc, lens, symbols=symbols)
    assert sum(len(h.tokens) for h in plain[0]) > 5
    assert _searches(model, enc, lens, LmFusion(lm, 0.0), symbols=symbols) == plain
    cancelled = LmFusion(lm, 0.7, lodr=lm, lodr_weight=0.7)
    assert not cancelled.scores(cancelled.start(3, "cpu")).any()  # exactly 0
    assert _searches(model, enc, lens, cancelled, symbols=symbols) == plain
    strong = _searches(model, enc, lens, LmFusion(lm, 3.0), symbols=symbols)
    assert strong != plain  # the same LM with a weight does change the output


def test_a_hand_built_lm_makes_greedy_and_beam_pick_the_token_they_miss():
    """Frame 1 favours t6 (0.55) over t5 (0.40); an LM that has only seen "t4 t5" lifts t5
    past it in both searches, and beam search's score is the acoustic log-probability plus
    the weighted LM log-probability of the tokens and of the end, once."""
    model = _hand_model()
    lm = lm_of([[4, 5]] * 5 + [[4, 6]], 2, V)
    fusion = LmFusion(lm, 0.5)
    greedy = GreedyOptions(max_symbols_per_frame=ONE)
    beam = BeamOptions(beam_size=3, max_symbols_per_frame=ONE, nbest=3)
    assert greedy_timed(model, FRAMES, LENS, greedy)[0].tokens == [4, 6]
    assert beam_nbest(model, FRAMES, LENS, beam)[0][0].tokens == (4, 6)
    assert greedy_timed(model, FRAMES, LENS, greedy, lm=fusion)[0].tokens == [4, 5]
    hyps = {h.tokens: h.score for h in beam_nbest(model, FRAMES, LENS, beam, lm=fusion)[0]}
    assert max(hyps, key=hyps.get) == (4, 5)
    # one token per frame: t4 ends frame 0, t5 frame 1, blank frame 2
    acoustic = math.log(0.9) + math.log(0.4) + math.log(1.0)
    expected = acoustic + 0.5 * lm.log_prob([4, 5])
    assert hyps[(4, 5)] == pytest.approx(expected, abs=1e-5)


def test_lm_and_biasing_scores_add():
    model = _hand_model()
    lm = lm_of([[4, 6], [4, 5], [4, 6]], 2, V)
    fusion = LmFusion(lm, 0.3)
    phrase = BiasingGraph.from_tokens([([4, 5], 1.0)], V)
    beam = BeamOptions(beam_size=3, max_symbols_per_frame=ONE, nbest=3)
    biased = {h.tokens: h.score for h in beam_nbest(model, FRAMES, LENS, beam, phrase)[0]}
    both = {h.tokens: h.score for h in beam_nbest(model, FRAMES, LENS, beam, phrase, fusion)[0]}
    for tokens in set(biased) & set(both):
        assert both[tokens] == pytest.approx(biased[tokens] + 0.3 * lm.log_prob(list(tokens)))
    assert set(biased) & set(both)


def test_chunk_by_chunk_with_an_lm_equals_the_whole():
    """Streaming's way: the LM state goes with the progress from one chunk to the next."""
    model = _random_model(9, seed=2)
    torch.manual_seed(5)
    enc = 3 * torch.randn(3, 14, 6, dtype=torch.float64)
    lens = torch.tensor([14, 9, 3])
    fusion = LmFusion(lm_of(random_sentences(9, 200, 4), 3, 9), 1.5)
    for search in (FrameLoopingGreedy(), BeamSearch(BeamOptions(4, nbest=1))):
        whole = search.best(
            search.advance(model, search.start(model, 3, "cpu", lm=fusion), enc, lens)
        )
        progress = search.start(model, 3, "cpu", lm=fusion)
        for chunk in (slice(0, 4), slice(4, 9), slice(9, 14)):
            part = (lens - chunk.start).clamp(0, chunk.stop - chunk.start)
            progress = search.advance(model, progress, enc[:, chunk], part)
        assert search.best(progress) == whole


# -- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("weight", [-0.1, math.inf, math.nan, MAX_LM_WEIGHT + 1, "x"])
def test_a_bad_weight_is_one_line(weight):
    with pytest.raises(ValueError, match=r"^lm_weight must be") as err:
        check_lm_weight("lm_weight", weight)
    assert "\n" not in str(err.value)


def test_a_word_level_lm_is_refused_naming_its_first_unknown_token(tmp_path):
    path = tmp_path / "words.arpa"
    write_arpa(train_kneser_ney([["HELLO", "WORLD"], ["HELLO", "THERE"]], 2), path)
    with pytest.raises(
        ValueError,
        match=r"words.arpa: 3 of its 6 tokens are not the model's pieces, the first 'HELLO'",
    ):
        load_fusion(pieces_of(9), path, 0.3)


def test_an_lm_over_another_vocabulary_size_and_one_too_big_are_refused():
    lm = lm_of([[4, 5]], 2, 9)
    with pytest.raises(ValueError, match="the LM is over 9 tokens, the model has 10"):
        LmFusion(lm, 0.3).for_model(10, 0, "cpu")
    with pytest.raises(MemoryError, match=r"take 0.00 GB, more than half the 0.00 GB free on cpu"):
        LmFusion(lm, 0.3).check_fits("cpu", free=100)


def test_a_lodr_weight_without_a_lodr_lm_is_refused(tmp_path):
    pieces = pieces_of(9)
    path = tmp_path / "lm.arpa"
    counter = KneserNeyCounter(2, pieces.__getitem__)
    counter.add([4, 5])
    write_arpa(counter.estimate(), path)
    with pytest.raises(ValueError, match="a LODR weight needs a LODR LM"):
        load_fusion(pieces, path, 0.3, lodr_weight=0.1)


@pytest.mark.parametrize("order", [2, 4, 6])
def test_dense_rows_give_what_the_back_off_walk_gives(order):
    """Dense rows for the states up to each order: the same scores, next states and end
    scores as walking the back-off chain from the root's row, with fewer steps."""
    lm = lm_of(random_sentences(11, 200, order), order, 11)
    assert lm.dense_order == 0 and lm.sparse_levels == order - 1
    states = torch.arange(lm.num_states)
    tokens = torch.randint(0, 11, (lm.num_states,))
    for k in range(order):
        dense = lm.densified(lm.dense_nbytes(k))
        assert dense.dense_order == k and dense.sparse_levels == order - 1 - k
        # (the back-off weights summed in another order: float rounding apart)
        torch.testing.assert_close(dense.all_scores(states), lm.all_scores(states))
        assert torch.equal(dense.step(states, tokens), lm.step(states, tokens))
        torch.testing.assert_close(dense.end_scores(states), lm.end_scores(states))
        assert dense.nbytes() == lm.nbytes() + lm.dense_nbytes(k) - lm.dense_nbytes(0)
    assert lm.densified(lm.dense_nbytes(1) - 1).dense_order == 0


def test_a_lodr_weight_above_the_lm_s_is_refused():
    lm = lm_of([[4, 5]], 2, 9)
    with pytest.raises(ValueError, match="lodr_weight 0.3 is above lm_weight 0.1"):
        LmFusion(lm, 0.1, lodr=lm, lodr_weight=0.3)
    LmFusion(lm, 0.3, lodr=lm, lodr_weight=0.3)  # equal: allowed (it cancels)


@pytest.mark.parametrize("symbols", [1, 3])
def test_a_tdt_fuses_an_lm_in_greedy_and_beam_alike(symbols):
    """A token-and-duration transducer: weight 0 changes no search; with an LM that does
    change the output, a beam of 1 is still greedy search (tokens, frames, durations)."""
    from tests.decoding.test_tdt_search import _random_batch, _random_tdt, _timed

    model = _random_tdt(dtype=torch.float64)
    enc, lens = _random_batch(dtype=torch.float64)
    lm = lm_of(random_sentences(9, 200, 7), 3, 9)
    plain = _searches(model, enc, lens, symbols=symbols)
    assert _searches(model, enc, lens, LmFusion(lm, 0.0), symbols=symbols) == plain
    fusion = LmFusion(lm, 1.0)
    greedy = greedy_timed(model, enc, lens, GreedyOptions(symbols), lm=fusion)
    beam = beam_nbest(model, enc, lens, BeamOptions(1, symbols), lm=fusion)
    assert _timed([hyps[0].timed() for hyps in beam]) == _timed(greedy)
    assert _timed(greedy) != _timed(plain[0])
