"""The label-looping greedy search gives frame-looping greedy search's tokens and frames,
in both of its loops (the eager one and the CUDA graph's fused body, here run eagerly)."""

import pytest
import torch
from torch import nn

from asr.decoding.label_looping import LabelLoopingGreedy, _LabelLoops
from asr.decoding.search import decode_with
from asr.decoding.transducer import FrameLoopingGreedy, GreedyOptions, GreedyProgress
from asr.models.transducer import Joiner, Predictor, PredictorConfig, Transducer
from tests.decoding.searching import greedy_timed, label_looping
from tests.decoding.test_transducer import _hand_built

LOOPS = [pytest.param(False, id="eager-loops"), pytest.param(True, id="graph-body")]


def _pairs(hyps):
    return [(h.tokens, h.frames) for h in hyps]


@pytest.mark.parametrize("fused", LOOPS)
@pytest.mark.parametrize("symbols", [1, 2, 3])
def test_hand_built_joiner(fused, symbols):
    model, enc, lens = _hand_built()
    options = GreedyOptions(max_symbols_per_frame=symbols)
    expected = _pairs(greedy_timed(model, enc, lens, options))
    assert _pairs(label_looping(model, enc, lens, options, fused)) == expected
    if symbols == 3:
        assert expected == [([3, 5, 6, 2], [0, 2, 2, 3]), ([1, 1], [1, 1])]


@pytest.mark.parametrize("fused", LOOPS)
@pytest.mark.parametrize("k", [1, 3])
def test_never_blank_joiner_stops_at_the_symbol_limit(fused, k):
    model, enc, lens = _hand_built(table={}, default=4)
    hyps = label_looping(model, enc, lens, GreedyOptions(max_symbols_per_frame=k), fused)
    assert [h.tokens for h in hyps] == [[4] * (4 * k), [4] * (3 * k)]
    assert hyps[1].frames == [f for f in range(3) for _ in range(k)]


def _random_model(kind: str, vocab: int = 9) -> Transducer:
    torch.manual_seed(0)
    config = PredictorConfig(embed_dim=8, hidden_dim=10, kind=kind, context_size=2, num_layers=2)
    predictor = Predictor(config, vocab_size=vocab)
    joiner = Joiner(encoder_dim=6, predictor_dim=10, joint_dim=12, vocab_size=vocab)
    return Transducer(nn.Identity(), predictor, joiner).eval()


@pytest.mark.parametrize("fused", LOOPS)
@pytest.mark.parametrize("kind", ["lstm", "stateless"])
def test_random_models_match_frame_looping(fused, kind):
    model = _random_model(kind)
    generator = torch.Generator().manual_seed(1)
    enc = 3 * torch.randn(6, 40, 6, generator=generator)
    lens = torch.tensor([40, 17, 1, 0, 33, 5])
    expected = greedy_timed(model, enc, lens)
    found = label_looping(model, enc, lens, fused=fused)
    assert found == expected  # tokens, frames and the confidences each search computes
    got, expected = _pairs(found), _pairs(expected)
    assert got == expected
    assert sum(len(t) for t, _ in got) > 30  # the random model does emit tokens
    assert got[3] == ([], [])


def test_buffers_are_updated_in_place():
    """What a CUDA graph replays must write into the tensors it was captured with."""
    model = _random_model("lstm")
    search = _LabelLoops(model, GreedyOptions(), use_cuda_graphs=False, biased=False)
    enc = model.joiner.project_encoder(torch.randn(3, 12, 6))
    with torch.inference_mode():
        buffers = search._allocate(enc, 3, 12)
        progress = GreedyProgress.start(model, 3, "cpu")
        search._reset(buffers, enc, torch.tensor([12, 5, 9]), progress)
        before = {name: t.data_ptr() for name, t in vars(buffers).items() if torch.is_tensor(t)}
        states = [s.data_ptr() for s in buffers.state]
        for _ in range(30):
            search._fused_step(buffers)
    after = {name: t.data_ptr() for name, t in vars(buffers).items() if torch.is_tensor(t)}
    assert after == before and [s.data_ptr() for s in buffers.state] == states
    assert int(buffers.count.sum()) > 0


def test_empty_inputs():
    model, enc, lens = _hand_built()
    search = LabelLoopingGreedy()
    assert decode_with(search, model, enc[:0], lens[:0]) == []
    empty = decode_with(search, model, enc[:, :0], torch.tensor([0, 0]))
    assert _pairs(empty) == [([], []), ([], [])]
    with pytest.raises(ValueError, match="max_symbols_per_frame"):
        GreedyOptions(max_symbols_per_frame=0)


@pytest.mark.parametrize("fused", LOOPS)
def test_chunk_by_chunk_equals_whole_and_frame_looping(fused):
    """Streaming's way: the same progress advanced chunk by chunk gives the whole
    utterance's tokens, frames and confidences, and the two greedy searches can take
    turns on it."""
    model = _random_model("lstm")
    generator = torch.Generator().manual_seed(2)
    enc = 3 * torch.randn(3, 20, 6, generator=generator)
    lens = torch.tensor([20, 13, 6])
    whole = greedy_timed(model, enc, lens)
    label = LabelLoopingGreedy(loops="fused" if fused else "eager")
    frame = FrameLoopingGreedy()
    progress = label.start(model, 3, "cpu")
    for i, chunk in enumerate((slice(0, 7), slice(7, 14), slice(14, 20))):
        part = (lens - chunk.start).clamp(0, chunk.stop - chunk.start)
        search = label if i != 1 else frame
        progress = search.advance(model, progress, enc[:, chunk], part)
    assert label.best(progress) == whole
    assert sum(len(h.tokens) for h in whole) > 10
