"""The machinery both graph-replayed searches share, its logic checked on a CPU (where a
`GraphedStep` runs its step eagerly): buffers reused while a batch fits and grown in every
dimension when one does not, the replay loop's checks, one search per model and key."""

import gc
import weakref

import torch
from torch import nn

from asr.decoding.cuda_graphs import REPLAYS_PER_CHECK, KeptBuffers, kept_with, run_steps

CPU = torch.device("cpu")


def test_kept_buffers_are_reused_while_a_batch_fits_and_grow_in_every_dimension():
    allocated: list[tuple[int, ...]] = []

    def allocate(sizes):
        allocated.append(sizes)
        return torch.zeros(sizes)

    kept = KeptBuffers(lambda buffers: buffers.add_(1))
    first, step = kept.get((4, 10), "f32", allocate, CPU, graphs=True)
    step()
    assert first.shape == (4, 10) and int(first.sum()) == 40
    again, _ = kept.get((3, 10), "f32", allocate, CPU, graphs=True)
    assert again is first  # fits: no new buffers, no new capture
    grown, step = kept.get((2, 12), "f32", allocate, CPU, graphs=True)
    assert grown.shape == (4, 12)  # the larger of the two in each dimension
    step()
    assert int(grown.sum()) == 48 and int(first.sum()) == 40  # the step runs on the new ones
    other, _ = kept.get((1, 1), "f64", allocate, CPU, graphs=True)
    assert other.shape == (1, 1) and kept.buffers is other  # another dtype: new buffers
    eager, _ = kept.get((2, 3), "f64", allocate, CPU, graphs=False)
    assert eager.shape == (2, 3) and kept.buffers is other  # eager: exact, not kept
    assert allocated == [(4, 10), (4, 12), (1, 1), (2, 3)]


def test_run_steps_checks_between_groups_and_stops_at_the_limit():
    calls, checks = [], []

    def finished():
        checks.append(len(calls))
        return len(calls) >= 6

    run_steps(lambda: calls.append(1), finished)
    assert checks == [0, REPLAYS_PER_CHECK, 2 * REPLAYS_PER_CHECK]  # a group is never cut
    calls.clear()
    run_steps(lambda: calls.append(1), lambda: False, max_steps=REPLAYS_PER_CHECK + 1)
    assert len(calls) == REPLAYS_PER_CHECK + 1
    calls.clear()
    run_steps(lambda: calls.append(1), lambda: True)
    assert calls == []


class _Search:
    pass


def test_one_search_per_model_and_key_gone_with_the_model():
    model = nn.Linear(2, 2)
    first = kept_with(model, ("greedy", 1), _Search)
    assert kept_with(model, ("greedy", 1), _Search) is first
    assert kept_with(model, ("greedy", 2), _Search) is not first
    assert kept_with(nn.Linear(2, 2), ("greedy", 1), _Search) is not first
    search = weakref.ref(first)
    del model, first
    gc.collect()
    assert search() is None


def test_a_real_search_kept_with_its_model_goes_with_it():
    """The cached searches refer to their model weakly: caching does not keep models alive
    (a server or a notebook that loads model after model would otherwise keep them all)."""
    from asr.decoding.label_looping import LabelLoopingGreedy, _LabelLoops
    from asr.decoding.search import decode_with
    from asr.decoding.transducer import GreedyOptions
    from tests.decoding.test_label_looping import _random_model

    model = _random_model("lstm")
    hyps = decode_with(LabelLoopingGreedy(), model, torch.randn(2, 5, 6), torch.tensor([5, 3]))
    assert len(hyps) == 2
    search = kept_with(model, (_LabelLoops, GreedyOptions(), False, False), _Search)
    assert isinstance(search, _LabelLoops)  # the one the search kept, not a new one
    gone = weakref.ref(model), weakref.ref(search)
    del model, search
    gc.collect()
    assert gone[0]() is None and gone[1]() is None
