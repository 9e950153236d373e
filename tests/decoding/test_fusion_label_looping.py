"""Language-model fusion in label-looping greedy search: its eager loops and the CUDA graph's
fused body (run eagerly here) make frame-looping greedy search's decisions with the same LM
(tokens, frames, confidences; a TDT's durations, visited frames and skips too), with and
without biasing and LODR, at weights that change the output; weight 0 changes nothing;
chunk by chunk equals the whole, with the two greedy searches taking turns on a stream;
the search (and its graph) is kept per LM and goes when the LM goes."""

import gc
import random
import weakref

import pytest
import torch

from asr.decoding.biasing import BiasingGraph
from asr.decoding.cuda_graphs import _KEPT
from asr.decoding.fusion import LmFusion, TokenLm
from asr.decoding.hypotheses import TimedTokens
from asr.decoding.kneser_ney import KneserNeyCounter
from asr.decoding.label_looping import LabelLoopingGreedy, _LabelLoops
from asr.decoding.search import decode_with, search_whole
from asr.decoding.transducer import FrameLoopingGreedy, GreedyOptions, GreedyProgress
from asr.models.transducer import Transducer
from tests.decoding.test_biasing import FRAMES, LENS, ONE, V, _hand_model
from tests.decoding.test_tdt_search import _random_batch, _random_tdt
from tests.decoding.test_transducer_beam import _random_model

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread is fastest

LOOPS = [pytest.param(False, id="eager-loops"), pytest.param(True, id="graph-body")]
VOCAB = 9  # ids 0-3 special (blank, unk, BOS, EOS), text tokens 4-8
PIECES = ["<blk>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, VOCAB)]
# the random models' tokens are unsure: at 0.1 the LM changes some already, at 0.5 most;
# at 2.0 it leaves few (its shallow-fusion penalty outweighs the model's every token)
WEIGHTS = [0.1, 0.5, 2.0]


def _lm(order: int, seed: int, pieces: list[str] = PIECES) -> TokenLm:
    """An n-gram of a skewed, repetitive random text over the text tokens of `pieces`."""
    rng = random.Random(seed)
    counter = KneserNeyCounter(order, pieces.__getitem__)
    for _ in range(200):
        length = rng.randint(1, 8)
        counter.add([min(4 + int(rng.expovariate(0.7)), len(pieces) - 1) for _ in range(length)])
    return TokenLm.from_ngram(counter.estimate(), pieces)


LM3 = _lm(3, seed=0)
LODR = _lm(2, seed=1)


def _fusion(weight: float, lodr: bool = False) -> LmFusion:
    return LmFusion(LM3, weight, LODR if lodr else None, 0.5 * weight if lodr else 0.0)


def _frame(model, enc, lens, options=GreedyOptions(), biasing=None, lm=None) -> list[TimedTokens]:
    return decode_with(FrameLoopingGreedy(options), model, enc, lens, biasing, lm)


def _label(
    model, enc, lens, options=GreedyOptions(), fused=False, biasing=None, lm=None
) -> list[TimedTokens]:
    search = LabelLoopingGreedy(options, loops="fused" if fused else "eager")
    return decode_with(search, model, enc, lens, biasing, lm)


def _batch(seed: int = 1, frames: int = 30) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    enc = 3 * torch.randn(5, frames, 6, generator=generator, dtype=torch.float64)
    return enc, torch.tensor([frames, frames - 11, 1, 0, frames - 4])


def _tokens(hyps: list[TimedTokens]) -> list[list[int]]:
    return [h.tokens for h in hyps]


# -- the same decisions as frame-looping greedy search ---------------------------------------
@pytest.mark.parametrize("fused", LOOPS)
@pytest.mark.parametrize("kind", ["lstm", "stateless"])
@pytest.mark.parametrize("symbols", [1, 3])
@pytest.mark.parametrize("lodr", [False, True], ids=["lm", "lm+lodr"])
def test_label_looping_with_an_lm_gives_frame_looping_s_output(fused, kind, symbols, lodr):
    model = _random_model(VOCAB, kind)
    enc, lens = _batch()
    options = GreedyOptions(max_symbols_per_frame=symbols)
    plain = _frame(model, enc, lens, options)
    assert sum(len(h.tokens) for h in plain) > 20  # the random model does emit tokens
    for weight in WEIGHTS:
        lm = _fusion(weight, lodr)
        expected = _frame(model, enc, lens, options, lm=lm)
        # tokens, frames and confidences; and the LM did decide something
        assert _label(model, enc, lens, options, fused, lm=lm) == expected
        assert _tokens(expected) != _tokens(plain)
        if weight < max(WEIGHTS):
            assert sum(len(h.tokens) for h in expected) > 10


@pytest.mark.parametrize("fused", LOOPS)
@pytest.mark.parametrize("kind", ["lstm", "stateless"])
def test_lm_and_biasing_scores_add_alike_in_both_searches(fused, kind):
    model = _random_model(VOCAB, kind)
    enc, lens = _batch(seed=2)
    graph = BiasingGraph.from_tokens([([4, 5], 2.0), ([7, 8, 7], 1.5)], VOCAB)
    biased = _frame(model, enc, lens, biasing=graph)
    for weight in WEIGHTS:
        lm = _fusion(weight)
        expected = _frame(model, enc, lens, biasing=graph, lm=lm)
        assert _label(model, enc, lens, fused=fused, biasing=graph, lm=lm) == expected
        assert _tokens(expected) != _tokens(biased)
        if weight < max(WEIGHTS):  # both scores count
            assert _tokens(expected) != _tokens(_frame(model, enc, lens, lm=lm))


@pytest.mark.parametrize("fused", LOOPS)
@pytest.mark.parametrize("kind", ["lstm", "stateless"])
@pytest.mark.parametrize("symbols", [1, 3])
@pytest.mark.parametrize("biased", [False, True], ids=["plain", "biased"])
def test_a_tdt_with_an_lm_gives_frame_looping_s_tokens_frames_and_durations(
    fused, kind, symbols, biased
):
    model = _random_tdt(kind)
    enc, lens = _random_batch()
    graph = BiasingGraph.from_tokens([([4, 5], 2.0), ([7, 8, 7], 1.5)], 9) if biased else None
    options = GreedyOptions(max_symbols_per_frame=symbols)
    frame = FrameLoopingGreedy(options)
    label = LabelLoopingGreedy(options, loops="fused" if fused else "eager")
    plain = frame.best(search_whole(frame, model, enc, lens, graph))
    for weight in WEIGHTS:
        lm = _fusion(weight, lodr=weight == 1.0)
        expected = search_whole(frame, model, enc, lens, graph, lm)
        found = search_whole(label, model, enc, lens, graph, lm)
        assert label.best(found) == frame.best(expected)  # tokens, frames, confidences, durations
        assert found.visited == expected.visited
        assert found.rows.skip.tolist() == expected.rows.skip.tolist()
        assert torch.equal(found.rows.lm_states, expected.rows.lm_states)
        assert torch.equal(found.rows.lm_scores, expected.rows.lm_scores)
        assert _tokens(frame.best(expected)) != _tokens(plain)
    assert any(d > 1 for h in plain for d in h.durations)


def test_an_lm_makes_label_looping_pick_the_token_frame_looping_picks():
    """Frame 1 favours 6 over 5 (0.55 to 0.4); an LM that has only seen "4 5" makes both
    greedy searches take 5 after 4."""
    pieces = ["<blk>", "<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(4, V)]
    counter = KneserNeyCounter(2, pieces.__getitem__)
    for _ in range(5):
        counter.add([4, 5])
    counter.add([6])
    lm = LmFusion(TokenLm.from_ngram(counter.estimate(), pieces), 0.5)
    model, options = _hand_model(), GreedyOptions(max_symbols_per_frame=ONE)
    assert _frame(model, FRAMES, LENS, options)[0].tokens == [4, 6]
    expected = _frame(model, FRAMES, LENS, options, lm=lm)
    assert expected[0].tokens == [4, 5] and expected[0].frames == [0, 1]
    for fused in (False, True):
        assert _label(model, FRAMES, LENS, options, fused, lm=lm) == expected


# -- weight 0, streaming ----------------------------------------------------------------------
@pytest.mark.parametrize("fused", LOOPS)
@pytest.mark.parametrize("tdt", [False, True], ids=["plain", "tdt"])
def test_weight_zero_gives_what_no_lm_gives(fused, tdt):
    model = _random_tdt("lstm") if tdt else _random_model(VOCAB, "lstm")
    enc, lens = _random_batch() if tdt else _batch()
    plain = _label(model, enc, lens, fused=fused)
    assert _label(model, enc, lens, fused=fused, lm=_fusion(0.0)) == plain
    assert _label(model, enc, lens, fused=fused, lm=_fusion(0.0, lodr=True)) == plain


@pytest.mark.parametrize("fused", LOOPS)
@pytest.mark.parametrize("tdt", [False, True], ids=["plain", "tdt"])
def test_chunk_by_chunk_with_an_lm_equals_the_whole_and_the_searches_take_turns(fused, tdt):
    """Two advances of one progress (the LM states carried between them) give the whole
    utterances' output; label- and frame-looping take turns on one stream."""
    model = _random_tdt("lstm", seed=1) if tdt else _random_model(VOCAB, "lstm", seed=1)
    enc, lens = _random_batch(seed=3, frames=24) if tdt else _batch(seed=3, frames=24)
    lm = _fusion(1.0, lodr=True)
    label = LabelLoopingGreedy(loops="fused" if fused else "eager")
    whole = decode_with(FrameLoopingGreedy(), model, enc, lens, lm=lm)
    assert whole != decode_with(FrameLoopingGreedy(), model, enc, lens)
    assert decode_with(label, model, enc, lens, lm=lm) == whole
    chunks = (slice(0, 9), slice(9, 24))
    for turns in ([label, label], [label, FrameLoopingGreedy()], [FrameLoopingGreedy(), label]):
        progress = turns[0].start(model, enc.size(0), "cpu", lm=lm)
        for search, chunk in zip(turns, chunks, strict=True):
            part = (lens - chunk.start).clamp(0, chunk.stop - chunk.start)
            progress = search.advance(model, progress, enc[:, chunk], part)
        assert progress.best() == whole


# -- the buffers and the kept search ------------------------------------------------------------
def test_lm_buffers_are_updated_in_place():
    """What a CUDA graph replays must write into the tensors it was captured with."""
    model = _random_model(VOCAB, "lstm")
    lm = _fusion(1.0, lodr=True).for_model(VOCAB, model.blank_id, "cpu")
    search = _LabelLoops(model, GreedyOptions(), use_cuda_graphs=False, biased=False, lm=lm)
    enc = model.joiner.project_encoder(torch.randn(3, 12, 6, dtype=torch.float64))
    with torch.inference_mode():
        buffers = search._allocate(enc, 4, 12)  # a row more than the batch: an idle one
        progress = GreedyProgress.start(model, 3, "cpu", lm=lm)
        search._reset(buffers, enc, torch.tensor([12, 5, 9]), progress)
        assert buffers.lm_states.shape == (4, 2) and buffers.lm_scores.shape == (4, VOCAB)
        start = buffers.lm_states.clone()
        before = {name: t.data_ptr() for name, t in vars(buffers).items() if torch.is_tensor(t)}
        for _ in range(30):
            search._fused_step(buffers)
    after = {name: t.data_ptr() for name, t in vars(buffers).items() if torch.is_tensor(t)}
    assert after == before
    assert int(buffers.count.sum()) > 0 and not torch.equal(buffers.lm_states, start)


def _kept_lm_searches(model: Transducer) -> list[_LabelLoops]:
    """The label-looping searches kept with `model` that fuse an LM (keyed by its id too)."""
    return [s for key, s in _KEPT.get(model, {}).items() if key[0] is _LabelLoops and len(key) > 4]


def test_a_search_is_kept_per_lm_and_goes_with_it():
    """The graph reads an LM's tables where they are: each LM has its own kept search,
    which refers to it weakly and is dropped when the LM goes (so no later LM that gets
    its id can meet a graph captured over freed tables)."""
    model = _random_model(VOCAB, "lstm")
    enc, lens = _batch()
    first, second = _fusion(1.0), _fusion(1.0)
    search = LabelLoopingGreedy(loops="fused")
    assert decode_with(search, model, enc, lens, lm=first) == decode_with(
        search, model, enc, lens, lm=second
    )
    decode_with(search, model, enc, lens, lm=first)  # the same one again: no new search
    kept = _kept_lm_searches(model)
    assert len(kept) == 2
    variant = second.for_model(VOCAB, model.blank_id, "cpu")  # the one its progresses hold
    assert {id(s.lm) for s in kept} == {
        id(first.for_model(VOCAB, model.blank_id, "cpu")),
        id(variant),
    }
    gone = weakref.ref(first)
    del first, kept
    gc.collect()
    assert gone() is None
    assert [s.lm for s in _kept_lm_searches(model)] == [variant]
    decode_with(search, model, enc, lens)  # and without an LM: another key
    assert [s.lm for s in _kept_lm_searches(model)] == [variant]


def test_a_progress_with_another_lm_than_the_search_s_is_refused():
    model = _random_model(VOCAB, "lstm")
    lm = _fusion(1.0).for_model(VOCAB, model.blank_id, "cpu")
    search = _LabelLoops(model, GreedyOptions(), use_cuda_graphs=False, biased=False, lm=lm)
    enc, lens = _batch()
    progress = GreedyProgress.start(model, enc.size(0), "cpu")
    with pytest.raises(ValueError, match="another language model"):
        search.advance(progress, enc, lens, fused=True)


# -- CUDA: the graph replayed --------------------------------------------------------------------
def _timed(hyps: list[TimedTokens]) -> list[tuple]:
    return [(h.tokens, h.frames, h.durations) for h in hyps]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tdt", [False, True], ids=["plain", "tdt"])
def test_the_captured_graph_with_an_lm_gives_frame_looping_s_output_on_cuda(tdt):
    model = (_random_tdt("lstm") if tdt else _random_model(VOCAB, "lstm").float()).cuda()
    enc, lens = _random_batch() if tdt else _batch()
    enc = enc.float().cuda()
    graph = BiasingGraph.from_tokens([([4, 5], 2.0)], VOCAB)
    options = GreedyOptions()
    for weight in WEIGHTS:
        for biasing in (None, graph):
            lm = _fusion(weight, lodr=True)
            expected = _frame(model, enc, lens, options, biasing, lm)
            found = decode_with(LabelLoopingGreedy(options), model, enc, lens, biasing, lm)
            assert _timed(found) == _timed(expected)
            for f, e in zip(found, expected, strict=True):
                assert f.confidences == pytest.approx(e.confidences, abs=1e-5)
            variant = lm.for_model(VOCAB, model.blank_id, enc.device)
            key = (_LabelLoops, options, biasing is not None, True, id(variant))
            assert _KEPT[model][key].kept.graphed.captured  # replayed, not run eagerly
