"""Language-model fusion in the attention encoder-decoder's beam search (and its greedy
search, the beam of width 1): weight 0 and a LODR LM that cancels the LM change nothing,
a heavy LM picks its sentence, the LM's scores (the end's included) and the biasing bonus
add, the length penalty divides the fused sum."""

import pytest

from asr.decoding import aed
from asr.decoding.biasing import BiasingGraph
from asr.decoding.fusion import LmFusion, TokenLm
from asr.decoding.kneser_ney import KneserNeyCounter
from asr.decoding.search import decode, decode_nbest
from asr.tokens import SPECIAL_PIECES
from tests.decoding.test_aed import VOCAB, encoded, sequence_score, trained_looking_aed

# token id i is PIECES[i]: the special pieces, then text pieces t4 .. t39
PIECES = [SPECIAL_PIECES[i] for i in range(len(SPECIAL_PIECES))]
PIECES += [f"t{i}" for i in range(len(PIECES), VOCAB)]
LENS = [30, 22, 9]
WIDE = aed.AedSearchOptions(beam_size=4, nbest=4)


def token_lm(sentences: list[list[int]], order: int = 3) -> TokenLm:
    counter = KneserNeyCounter(order, lambda t: PIECES[t])
    for sentence in sentences:
        counter.add(sentence)
    return TokenLm.from_ngram(counter.estimate(), PIECES)


SENTENCE = [30, 31, 32]


def sentence_lm() -> TokenLm:
    """An LM of `SENTENCE` (seen 20 times; once a sentence of every text piece, so that no
    piece is all but forbidden)."""
    return token_lm([SENTENCE] * 20 + [list(range(4, VOCAB))])


def as_dict(nbest: list[list[tuple[list[int], float]]]) -> list[dict[tuple[int, ...], float]]:
    return [{tuple(tokens): score for tokens, score in hyps} for hyps in nbest]


@pytest.fixture(scope="module")
def case():
    model = trained_looking_aed()
    enc, lens = encoded(model, LENS)
    plain = aed.beam_search_nbest(model, enc, lens, WIDE)
    # an LM of sentences that are not the model's best hypotheses
    said = {tuple(hyps[0][0]) for hyps in plain}
    sentences = [[11, 12, 13, 14, 15], [20, 21, 22], [11, 12, 30]]
    assert not said & {tuple(s) for s in sentences}
    return model, enc, lens, plain, token_lm(sentences)


def test_weight_zero_changes_nothing(case):
    model, enc, lens, plain, lm = case
    zero = LmFusion(lm, 0.0)
    assert aed.beam_search_nbest(model, enc, lens, WIDE, None, zero) == plain
    one = aed.AedSearchOptions(beam_size=1)
    assert aed.decode(model, enc, lens, one, None, zero) == aed.greedy_search(model, enc, lens)
    graph = BiasingGraph.from_tokens([([11, 12, 13], 2.0)], VOCAB)
    biased = aed.beam_search_nbest(model, enc, lens, WIDE, graph)
    assert aed.beam_search_nbest(model, enc, lens, WIDE, graph, zero) == biased


def test_lodr_of_the_same_lm_and_weight_cancels_exactly(case):
    model, enc, lens, plain, lm = case
    cancelled = LmFusion(lm, 2.0, lm, 2.0)
    assert aed.beam_search_nbest(model, enc, lens, WIDE, None, cancelled) == plain
    alone = LmFusion(lm, 2.0)
    assert aed.beam_search_nbest(model, enc, lens, WIDE, None, alone) != plain


@pytest.mark.parametrize("beam_size", [4, 8])
def test_a_heavy_lm_makes_the_beam_pick_its_sentence(case, beam_size):
    """An LM of one sentence the model does not say: at weight 0 no utterance ends with
    it, at a large weight every one does."""
    model, enc, lens, plain, _ = case
    lm = sentence_lm()
    options = aed.AedSearchOptions(beam_size=beam_size)
    assert SENTENCE not in aed.beam_search(model, enc, lens, options, None, LmFusion(lm, 0.0))
    fused = aed.beam_search(model, enc, lens, options, None, LmFusion(lm, 5.0))
    assert fused == [SENTENCE] * len(LENS)
    # the same through asr.decoding.search, which passes the LM on positionally
    assert decode(model, enc, lens, options, None, LmFusion(lm, 5.0)) == fused


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_lm_scores_and_the_biasing_bonus_add(case, length_penalty):
    """A hypothesis's score with both = its score with biasing alone + the LM's weighted
    log-probability of its tokens and the end, all divided by the length penalty."""
    model, enc, lens, _, lm = case
    options = aed.AedSearchOptions(beam_size=6, nbest=6, length_penalty=length_penalty)
    graph = BiasingGraph.from_tokens([([11, 12, 13], 2.0), ([20, 21], 1.5)], VOCAB)
    weight = 0.3
    biased = as_dict(aed.beam_search_nbest(model, enc, lens, options, graph))
    both = as_dict(aed.beam_search_nbest(model, enc, lens, options, graph, LmFusion(lm, weight)))
    compared = 0
    for alone, fused in zip(biased, both, strict=True):
        for tokens, score in fused.items():
            if tokens in alone:
                penalty = (len(tokens) + 1) ** length_penalty
                expected = alone[tokens] + weight * lm.log_prob(list(tokens)) / penalty
                assert score == pytest.approx(expected, abs=1e-5)
                compared += 1
    assert compared >= 2 * len(LENS)


def test_greedy_with_an_lm_is_the_beam_of_width_one(case):
    model, enc, lens, _, _ = case
    fusion = LmFusion(sentence_lm(), 1.0)
    one = aed.AedSearchOptions(beam_size=1)
    greedy = aed.decode(model, enc, lens, one, None, fusion)
    assert greedy == [
        hyps[0][0] for hyps in aed.beam_search_nbest(model, enc, lens, one, None, fusion)
    ]
    assert greedy != aed.greedy_search(model, enc, lens)  # the LM does change it
    assert decode_nbest(model, enc, lens, one, 1, None, fusion) == aed.beam_search_nbest(
        model, enc, lens, one, None, fusion
    )


def test_an_lm_over_another_vocabulary_is_refused(case):
    model, enc, lens, _, _ = case
    counter = KneserNeyCounter(2, lambda t: PIECES[t])
    counter.add([5, 6])
    small = TokenLm.from_ngram(counter.estimate(), PIECES[:20])
    with pytest.raises(ValueError, match="another tokenizer"):
        aed.beam_search_nbest(model, enc, lens, WIDE, None, LmFusion(small, 0.5))


def test_lm_states_follow_their_hypotheses_when_utterances_finish_apart(case):
    """Batched with an LM equals one utterance at a time (rows leave the batch as their
    utterance finishes; the LM states must move with them)."""
    model, enc, lens, _, lm = case
    fusion = LmFusion(lm, 1.5, token_lm([[20, 21, 22]], order=2), 0.4)
    batched = aed.beam_search_nbest(model, enc, lens, WIDE, None, fusion)
    for i, hyps in enumerate(batched):
        alone = aed.beam_search_nbest(
            model, enc[i : i + 1, : lens[i]], lens[i : i + 1], WIDE, None, fusion
        )[0]
        assert [t for t, _ in alone] == [t for t, _ in hyps]
        assert [s for _, s in alone] == pytest.approx([s for _, s in hyps], abs=1e-5)


@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_every_hypothesis_scores_its_log_probability_plus_the_lms(case, length_penalty):
    """Each hypothesis of the n-best lists, scored on its own: log P(tokens, EOS) from the
    uncached decoder plus the fused LM and LODR log-probabilities of its tokens and the
    end, divided by the length penalty (the LM states follow their hypotheses when the
    beam re-ranks them)."""
    model, enc, lens, _, _ = case
    lodr = token_lm([[20, 21, 22], [11, 12]], order=2)
    fusion = LmFusion(sentence_lm(), 1.0, lodr, 0.3)
    options = aed.AedSearchOptions(beam_size=6, nbest=6, length_penalty=length_penalty)
    nbest = aed.beam_search_nbest(model, enc, lens, options, None, fusion)
    for i, hyps in enumerate(nbest):
        assert len(hyps) == 6
        for tokens, score in hyps:
            total = sequence_score(model, enc[i : i + 1], lens[i : i + 1], tokens)
            total += fusion.weight * fusion.lm.log_prob(tokens)
            total -= fusion.lodr_weight * lodr.log_prob(tokens)
            assert score == pytest.approx(total / (len(tokens) + 1) ** length_penalty, abs=1e-4)
