"""The search contract: the factory from options, whole utterances as start + one advance,
progresses stacked and taken apart, and `advance_each` sharing a step between the rows
scored with the same biasing graph."""

import pytest
import torch

from asr.decoding.aed import AedSearchOptions
from asr.decoding.biasing import BiasingGraph
from asr.decoding.label_looping import LabelLoopingGreedy
from asr.decoding.search import advance_each, decode_with, transducer_search
from asr.decoding.transducer import FrameLoopingGreedy, GreedyOptions
from asr.decoding.transducer_beam import BeamOptions, BeamSearch
from tests.decoding.test_transducer_beam import _random_model


def test_the_factory_picks_the_search_of_the_options_and_device():
    assert isinstance(transducer_search(GreedyOptions()), FrameLoopingGreedy)
    assert isinstance(transducer_search(GreedyOptions(), "cuda"), LabelLoopingGreedy)
    beam = transducer_search(BeamOptions(beam_size=3), "cuda")
    assert isinstance(beam, BeamSearch) and beam.options.beam_size == 3
    with pytest.raises(TypeError, match="GreedyOptions or BeamOptions"):
        transducer_search(AedSearchOptions())


class Counting:
    """A real search that counts its `advance` calls."""

    def __init__(self, search):
        self.search, self.calls = search, 0

    def start(self, *args, **kwargs):
        return self.search.start(*args, **kwargs)

    def advance(self, *args, **kwargs):
        self.calls += 1
        return self.search.advance(*args, **kwargs)

    def best(self, progress):
        return self.search.best(progress)


@pytest.mark.parametrize("search", [FrameLoopingGreedy(), BeamSearch(BeamOptions(beam_size=3))])
def test_streams_with_the_same_graph_share_a_step_and_get_what_they_would_alone(search):
    model = _random_model(9)
    torch.manual_seed(4)
    enc = 3 * torch.randn(4, 10, 6, dtype=torch.float64)
    lens = torch.tensor([10, 6, 9, 3])
    graph = BiasingGraph.from_tokens([([4, 5], 2.0), ([6, 7, 8], 1.5)], 9)
    graphs = [graph, None, graph, None]
    counting = Counting(search)
    progresses = [counting.start(model, 1, "cpu", g) for g in graphs]
    for chunk in (slice(0, 4), slice(4, 10)):  # two chunks, as a stream gets them
        part = (lens - chunk.start).clamp(0, chunk.stop - chunk.start)
        progresses = advance_each(counting, model, progresses, enc[:, chunk], part)
    assert counting.calls == 4  # per chunk: one step for the graph's rows, one for the others
    alone = [
        decode_with(search, model, enc[i : i + 1], lens[i : i + 1], g)[0]
        for i, g in enumerate(graphs)
    ]
    assert [search.best(p)[0] for p in progresses] == alone
    assert sum(len(h.tokens) for h in alone) > 5


def test_advance_leaves_the_progress_it_was_given_as_it_was():
    model = _random_model(9)
    enc, lens = torch.randn(2, 8, 6, dtype=torch.float64), torch.tensor([8, 5])
    for search in (FrameLoopingGreedy(), BeamSearch(BeamOptions(beam_size=2))):
        start = search.start(model, 2, "cpu")
        before = search.best(start)
        search.advance(model, start, enc, lens)
        assert search.best(start) == before == [h for h in before if not h.tokens]


def test_progresses_of_different_graphs_are_not_stacked():
    model = _random_model(9)
    one, two = (BiasingGraph.from_tokens([([4, 5], 1.0)], 9) for _ in range(2))
    search = FrameLoopingGreedy()
    parts = [search.start(model, 1, "cpu", one), search.start(model, 1, "cpu", two)]
    with pytest.raises(ValueError, match="different biasing graphs"):
        type(parts[0]).cat(parts)


def test_a_search_started_later_counts_frames_from_the_start_of_the_audio():
    model = _random_model(9)
    torch.manual_seed(5)
    enc, lens = 3 * torch.randn(1, 12, 6, dtype=torch.float64), torch.tensor([12])
    search = FrameLoopingGreedy()
    whole = decode_with(search, model, enc, lens)[0]
    later = search.advance(model, search.start(model, 1, "cpu", first_frame=100), enc, lens)
    assert search.best(later)[0].frames == [f + 100 for f in whole.frames]
