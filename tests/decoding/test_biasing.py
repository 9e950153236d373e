"""Context biasing: the automaton's bonus (earned along a phrase, given back when the
match fails or the utterance ends inside it, kept for completed phrases), every search
recovering a phrase on a hand-built joiner that it misses without biasing, and an empty
phrase list changing nothing in any search."""

import math
import re

import numpy as np
import pytest
import torch
from torch import nn

from asr.decoding import aed
from asr.decoding.biasing import (
    MAX_BIASING_SCORE,
    BiasingGraph,
    BiasingPhrase,
    SharedBiasingGraphs,
    parse_phrase,
    read_biasing_phrases,
    tokenize_phrase,
)
from asr.decoding.search import decode_nbest
from asr.decoding.transducer import FrameLoopingGreedy, GreedyOptions
from asr.decoding.transducer_beam import BeamOptions, BeamSearch
from asr.models.transducer import Transducer
from tests.decoding.searching import beam_nbest, greedy_timed, label_looping
from tests.decoding.test_aed import VOCAB, encoded, trained_looking_aed
from tests.decoding.test_transducer import CountingPredictor
from tests.decoding.test_transducer_beam import _random_model

V = 10  # ids 0-3 are special (blank, unk, BOS, EOS): text tokens 4-9


def _bonus(graph: BiasingGraph, tokens: list[int]) -> float:
    """What a hypothesis of `tokens` keeps in the end: the gains of its tokens, then what
    it still holds given back."""
    node, total = 0, 0.0
    for token in tokens:
        total += float(graph.gain[node, token])
        node = int(graph.next[node, token])
    return total - float(graph.held[node])


def test_a_completed_phrase_keeps_its_bonus_and_a_near_miss_ends_with_none():
    # The first token of a phrase earns nothing; each further one earns the score.
    graph = BiasingGraph.from_tokens([([4, 5, 6], 1.0), ([7, 8], 2.0)], V)
    assert _bonus(graph, [4, 5, 6]) == pytest.approx(2.0)
    assert _bonus(graph, [9, 4, 5, 6, 9]) == pytest.approx(2.0)
    assert _bonus(graph, [7, 8, 4, 5, 6]) == pytest.approx(2.0 + 2.0)
    # Near-misses: the match fails (4 5 then 9), or the utterance ends inside it.
    assert _bonus(graph, [4, 5, 9]) == pytest.approx(0.0)
    assert _bonus(graph, [4, 5]) == pytest.approx(0.0)
    assert _bonus(graph, [4, 5, 9, 7]) == pytest.approx(0.0)
    # Along the way the partial match holds what it earned, and gives it back at the miss.
    at = int(graph.next[graph.next[0, 4], 5])
    assert float(graph.gain[0, 4]) == 0.0 and float(graph.held[at]) == 1.0
    assert float(graph.gain[at, 9]) == pytest.approx(-1.0)
    # A one-token phrase earns its score.
    assert _bonus(BiasingGraph.from_tokens([([4], 3.0)], V), [9, 4]) == pytest.approx(3.0)


def test_a_failed_match_falls_back_to_the_longest_partial_match_that_still_holds():
    # "4 4 4 5": after 4 4 4 4 the match "4 4 4" still holds (Aho-Corasick's failure link).
    graph = BiasingGraph.from_tokens([([4, 4, 4, 5], 1.0)], V)
    assert _bonus(graph, [4, 4, 4, 4, 5]) == pytest.approx(3.0)
    assert _bonus(graph, [4, 4, 4, 4]) == pytest.approx(0.0)


def test_a_longer_phrase_continues_a_completed_one():
    graph = BiasingGraph.from_tokens([([4, 5], 1.0), ([4, 5, 6, 7], 1.0)], V)
    assert _bonus(graph, [4, 5]) == pytest.approx(1.0)
    assert _bonus(graph, [4, 5, 6]) == pytest.approx(1.0)  # the short one kept, "6" given back
    assert _bonus(graph, [4, 5, 6, 7]) == pytest.approx(3.0)  # the longer one's bonus


def test_a_phrase_that_a_word_goes_on_after_keeps_nothing():
    """Tokens 4-7 start words, 8-9 continue them: "4 5" then 8 is a longer word."""
    starts = [i < 8 for i in range(V)]
    graph = BiasingGraph.from_tokens([([4, 5], 1.0), ([6, 5, 9], 1.0)], V, word_starts=starts)
    assert _bonus(graph, [4, 5]) == pytest.approx(1.0)  # the utterance ends after it
    assert _bonus(graph, [4, 5, 7]) == pytest.approx(1.0)  # a new word after it
    assert _bonus(graph, [4, 5, 8]) == pytest.approx(0.0)  # the word goes on
    assert _bonus(graph, [4, 5, 8, 7]) == pytest.approx(0.0)
    assert _bonus(graph, [6, 5, 9, 4]) == pytest.approx(2.0)  # continued inside its word


def test_special_tokens_and_bad_scores_are_refused():
    with pytest.raises(ValueError, match="not a text token"):
        BiasingGraph.from_tokens([([0, 4], 1.0)], V)
    with pytest.raises(ValueError, match="empty"):
        BiasingGraph.from_tokens([([], 1.0)], V)
    with pytest.raises(ValueError, match="must be >= 0"):
        parse_phrase("NAME :-1")
    with pytest.raises(ValueError, match="empty biasing phrase"):
        parse_phrase("  :2")
    with pytest.raises(ValueError, match="bad score"):
        parse_phrase("NAME :two")
    assert parse_phrase("NEW  YORK :2.5") == BiasingPhrase("NEW YORK", 2.5)
    assert parse_phrase(("NEW YORK", 1)) == BiasingPhrase("NEW YORK", 1.0)


TOO_LARGE = r"must be >= 0 and at most 50 per token .*got "


@pytest.mark.parametrize("score", [50.5, 1e308, math.inf, math.nan, -0.5])
def test_a_score_past_the_bound_is_refused_wherever_it_enters(score, tokenizer, tmp_path, capsys):
    """MAX_BIASING_SCORE (50 per token) in a phrase's ":SCORE", a (text, score) pair, a
    phrase file, the graph's construction (from text or tokens), the graphs a streaming
    recognizer shares, load_model(...).transcribe and --biasing-score: one line that names
    the value."""
    from asr.data.features import FeatureConfig
    from asr.inference.cli import transcribe_main
    from asr.inference.recognizer import Recognizer

    got = re.escape(repr(score))
    assert MAX_BIASING_SCORE == 50.0
    with pytest.raises(ValueError, match=f"biasing score of 'ZORVAK' {TOO_LARGE}{got}$"):
        parse_phrase(f"ZORVAK :{score}")
    with pytest.raises(ValueError, match=f"{TOO_LARGE}{got}$"):
        parse_phrase(("ZORVAK", score))
    path = tmp_path / "phrases.txt"
    path.write_text(f"ZANZIBAR\nZORVAK :{score}\n")
    with pytest.raises(
        ValueError, match=f"phrases.txt line 2: biasing score of 'ZORVAK' {TOO_LARGE}"
    ):
        read_biasing_phrases(path)
    with pytest.raises(ValueError, match=f"^biasing score {TOO_LARGE}{got}$"):
        BiasingGraph.from_phrases(["ZORVAK"], tokenizer, score=score)
    with pytest.raises(ValueError, match=rf"tokens \[4, 5\] {TOO_LARGE}{got}$"):
        BiasingGraph.from_tokens([([4, 5], score)], V)
    with pytest.raises(ValueError, match=f"{TOO_LARGE}{got}$"):
        SharedBiasingGraphs(tokenizer).get(["ZORVAK"], score)  # create_stream's graphs
    recognizer = Recognizer(_random_model(tokenizer.vocab_size), tokenizer, FeatureConfig())
    with pytest.raises(ValueError, match=f"{TOO_LARGE}{got}$"):
        recognizer.transcribe([np.zeros(1600, np.float32)], biasing=["ZORVAK"], biasing_score=score)
    with pytest.raises(SystemExit):  # argparse: before the model is read
        transcribe_main(
            ["model.pt", "a.flac", "--biasing-phrases", str(path), "--biasing-score", str(score)]
        )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --biasing-score: the score must be >= 0 and at most 50" in err
    assert err.endswith(f"got {score!r}")


def test_scores_up_to_the_bound_are_taken(tokenizer):
    assert parse_phrase("ZORVAK :50") == BiasingPhrase("ZORVAK", 50.0)
    assert parse_phrase("ZORVAK :0") == BiasingPhrase("ZORVAK", 0.0)
    graph = BiasingGraph.from_phrases(["ZORVAK", "ZANZIBAR :0.5"], tokenizer, score=50)
    assert torch.isfinite(graph.gain).all() and float(graph.gain.max()) == 50.0
    with pytest.raises(ValueError, match="biasing score must be a number, got 'high'"):
        BiasingGraph.from_phrases(["ZORVAK"], tokenizer, score="high")  # type: ignore[arg-type]


def test_phrase_files_and_tokenization(tmp_path, tokenizer):
    path = tmp_path / "phrases.txt"
    path.write_text("# names\nZANZIBAR\n\nDOCTOR ZORVAK :3\n")
    assert read_biasing_phrases(path) == [
        BiasingPhrase("ZANZIBAR"),
        BiasingPhrase("DOCTOR ZORVAK", 3.0),
    ]
    path.write_text("ZANZIBAR\nBAD :-2\n")
    with pytest.raises(ValueError, match=r"phrases.txt line 2: biasing score of 'BAD'"):
        read_biasing_phrases(path)
    variants = tokenize_phrase("zanzibar", tokenizer)  # the demo's vocabulary is upper case
    assert tokenizer.decode(variants[0]) == "ZANZIBAR"
    assert all(tokenizer.decode(v) == "ZANZIBAR" for v in variants)
    with pytest.raises(ValueError, match="lacks 'É'$"):
        tokenize_phrase("CAFÉ", tokenizer)
    graph = BiasingGraph.from_phrases(["ZANZIBAR", ("ZORVAK", 3.0)], tokenizer)
    assert graph.num_phrases == 2 and graph.vocab_size == tokenizer.vocab_size
    with pytest.raises(ValueError, match="biasing score must be >= 0"):
        BiasingGraph.from_phrases(["ZANZIBAR"], tokenizer, score=-1.0)
    with pytest.raises(ValueError, match="an ONNX export does not hold"):
        BiasingGraph.from_phrases(["ZANZIBAR"], object())  # type: ignore[arg-type]


# -- searches on a hand-built joiner ---------------------------------------------------
# Each encoder frame is the joiner's log-probabilities (the predictor plays no part), so
# each frame's choice is plain: frame 0 says 4, frame 1 favours 6 over 5.
class FramePredictor(CountingPredictor):
    vocab_size = V


class FrameJoiner(nn.Module):
    vocab_size = V

    def project_encoder(self, x):
        return x

    def project_predictor(self, x):
        return x

    def joint(self, enc, pred):
        return enc


def _frames(*rows: dict[int, float]) -> torch.Tensor:
    """(1, T, V) log-probabilities: each frame's named tokens, the rest sharing what is left."""
    out = torch.full((len(rows), V), -30.0, dtype=torch.float64)
    for t, row in enumerate(rows):
        for token, p in row.items():
            out[t, token] = math.log(p)
    return out.log_softmax(-1)[None]


FRAMES = _frames({4: 0.9, 0: 0.1}, {6: 0.55, 5: 0.4, 0: 0.05}, {0: 1.0})
LENS = torch.tensor([3])
ONE = 1  # one token per frame: each frame's choice is the joiner's only


def _hand_model() -> Transducer:
    return Transducer(nn.Identity(), FramePredictor(), FrameJoiner())


def test_every_transducer_search_recovers_the_phrase_it_misses_without_biasing():
    model = _hand_model()
    phrase = BiasingGraph.from_tokens([([4, 5], 1.0)], V)
    greedy = GreedyOptions(max_symbols_per_frame=ONE)
    beam = BeamOptions(beam_size=3, max_symbols_per_frame=ONE)
    assert greedy_timed(model, FRAMES, LENS, greedy)[0].tokens == [4, 6]
    assert greedy_timed(model, FRAMES, LENS, greedy, phrase)[0].tokens == [4, 5]
    assert beam_nbest(model, FRAMES, LENS, beam)[0][0].tokens == (4, 6)
    best = beam_nbest(model, FRAMES, LENS, beam, phrase)[0][0]
    assert best.tokens == (4, 5)
    assert best.score == pytest.approx(math.log(0.9 * 0.4) + 1.0)  # the bonus kept
    for fused in (False, True):  # label looping: its eager loops, and the CUDA graph's body
        assert label_looping(model, FRAMES, LENS, greedy, fused, phrase)[0].tokens == [4, 5]


def test_a_near_miss_gains_nothing_in_beam_nbest():
    """Phrase 4 6 7: the hypothesis 4 6 earns a bonus for 6, then the utterance ends
    inside the phrase: it ends with its plain score."""
    model = _hand_model()
    miss = BiasingGraph.from_tokens([([4, 6, 7], 1.0)], V)
    options = BeamOptions(beam_size=3, max_symbols_per_frame=ONE, nbest=3)
    plain = {h.tokens: h.score for h in beam_nbest(model, FRAMES, LENS, options)[0]}
    biased = {h.tokens: h.score for h in beam_nbest(model, FRAMES, LENS, options, miss)[0]}
    assert biased[(4, 6)] == pytest.approx(plain[(4, 6)])
    assert biased[(4, 5)] == pytest.approx(plain[(4, 5)])
    assert max(biased, key=biased.get) == (4, 6)


def test_streaming_search_recovers_the_phrase_chunk_by_chunk():
    """The phrase starts in one chunk and ends in the next: the state goes with the search."""
    model = _hand_model()
    phrase = BiasingGraph.from_tokens([([4, 5], 1.0)], V)
    greedy = GreedyOptions(max_symbols_per_frame=ONE)
    greedy = FrameLoopingGreedy(GreedyOptions(max_symbols_per_frame=ONE))
    progress = greedy.start(model, 1, "cpu", phrase)
    beam = BeamSearch(BeamOptions(beam_size=3, max_symbols_per_frame=ONE))
    beams = beam.start(model, 1, "cpu", phrase)
    for t in range(3):
        chunk = FRAMES[:, t : t + 1]
        progress = greedy.advance(model, progress, chunk, torch.tensor([1]))
        beams = beam.advance(model, beams, chunk, torch.tensor([1]))
    best = greedy.best(progress)[0]
    assert best.tokens == [4, 5] and best.frames == [0, 1]
    assert beam.best(beams)[0].tokens == [4, 5]


# -- an empty list changes nothing ---------------------------------------------------------
def test_an_empty_phrase_list_gives_what_no_biasing_gives():
    model = _random_model(9)
    torch.manual_seed(3)
    enc = 3 * torch.randn(4, 12, 6, dtype=torch.float64)
    lens = torch.tensor([12, 7, 1, 10])
    empty = BiasingGraph.from_tokens([], 9)
    for symbols in (1, 3):
        greedy = GreedyOptions(max_symbols_per_frame=symbols)
        plain = greedy_timed(model, enc, lens, greedy)
        assert sum(len(h.tokens) for h in plain) > 5
        assert greedy_timed(model, enc, lens, greedy, empty) == plain
        for fused in (False, True):
            assert label_looping(model, enc, lens, greedy, fused, empty) == plain
        beam = BeamOptions(beam_size=4, max_symbols_per_frame=symbols, nbest=4)
        assert beam_nbest(model, enc, lens, beam, empty) == beam_nbest(model, enc, lens, beam)
        # chunk by chunk (streaming's way): 5 frames, then the rest
        search = FrameLoopingGreedy(greedy)
        progress = search.start(model, 4, "cpu", empty)
        for chunk in (slice(0, 5), slice(5, 12)):
            part = (lens - chunk.start).clamp(0, chunk.stop - chunk.start)
            progress = search.advance(model, progress, enc[:, chunk], part)
        assert search.best(progress) == plain


def test_the_attention_decoder_beam_recovers_a_phrase_and_an_empty_list_changes_nothing():
    model = trained_looking_aed()
    enc, lens = encoded(model, [30, 22, 9])
    wide = aed.AedSearchOptions(beam_size=4, nbest=4)
    plain = aed.beam_search_nbest(model, enc, lens, wide)
    empty = BiasingGraph.from_tokens([], VOCAB)
    assert aed.beam_search_nbest(model, enc, lens, wide, biasing=empty) == plain
    assert aed.decode(model, enc, lens, aed.AedSearchOptions(), empty) == aed.greedy_search(
        model, enc, lens
    )
    # A phrase the model never says, boosted: utterance 0's best now holds it. Its first
    # token (which earns nothing) is the text token the model likes best to start with.
    state = model.decoder.init_state(enc[:1], lens[:1])
    logits, _ = model.decoder.step(torch.tensor([model.bos_id]), state)
    first = 4 + int(logits[0, 4:].argmax())
    words = [first, 11, 12] if first != 11 else [first, 12, 13]
    phrase = BiasingGraph.from_tokens([(words, 6.0)], VOCAB)

    def holds(tokens: list[int]) -> bool:
        return any(tokens[i : i + 3] == words for i in range(len(tokens)))

    assert not any(holds(hyps[0][0]) for hyps in plain)
    biased = aed.beam_search_nbest(model, enc, lens, wide, biasing=phrase)
    assert holds(biased[0][0][0])
    options = aed.AedSearchOptions(beam_size=4)
    assert decode_nbest(model, enc, lens, options, 2, phrase)[0][0] == biased[0][0]
