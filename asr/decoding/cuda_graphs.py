"""A decoding step over static tensors, replayed from a CUDA graph where it can be.

A greedy search runs the same few dozen small kernels once per token; at batch 32 on a
GPU each takes microseconds and launching them from Python takes longer than running
them. A CUDA graph records the step's kernels once and relaunches all of them with one
call (`torch.cuda.CUDAGraph`). What it needs of the step: it reads and writes only
tensors that live as long as the graph (every change in place), it never waits for the
GPU (no `.item()`, `bool(tensor)`, `.tolist()`), and its shapes never change. The
searches in `asr.decoding.label_looping` and `asr.decoding.aed` keep their state in such
tensors, so one function serves eager runs (CPU, tests) and graph replays (CUDA).

What both searches share lives here: `GraphedStep` (capture, or eager), `KeptBuffers`
(static tensors and their graph, reused while a batch fits, grown when one does not),
`run_steps` (replays between two questions to the GPU) and `kept_with` (one search per
model and options, kept as long as the model).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import torch
from torch import nn

from asr.errors import first_line

log = logging.getLogger(__name__)

WARMUP_CALLS = 2  # before capture, on a side stream: cuBLAS handles, cuDNN plans, lazy inits
REPLAYS_PER_CHECK = 4  # steps between two questions to the GPU (each one waits for it)

Buffers = TypeVar("Buffers")
Search = TypeVar("Search")
Model = TypeVar("Model", bound=nn.Module)


class GraphedStep:
    """`step()` run eagerly, or, on CUDA with `use_graph`, captured once and replayed.

    Warm-up calls and the capture run the step for real (the warm-up) or not at all (the
    capture records without executing): the owner resets its static state after
    `GraphedStep` is made. A capture that fails (an op that cannot be captured on this
    stack) is logged once and the step runs eagerly from then on: slower, never wrong.
    """

    def __init__(self, step: Callable[[], None], device: torch.device, use_graph: bool) -> None:
        self.step = step
        self.graph: torch.cuda.CUDAGraph | None = None
        if use_graph and device.type == "cuda":
            self.graph = _capture(step, device)

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.step()


def _capture(step: Callable[[], None], device: torch.device) -> torch.cuda.CUDAGraph | None:
    """The CUDA graph of `step`, or None (logged) when it cannot be captured."""
    try:
        with torch.cuda.device(device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP_CALLS):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            return graph
    except RuntimeError as err:
        log.warning("decoding without CUDA graphs: capture failed (%s)", first_line(err))
        torch.cuda.synchronize(device)
        return None


class KeptBuffers(Generic[Buffers]):
    """A search's static tensors and the graph of its step over them, kept for later batches.

    `get(sizes, ...)` with `graphs` False: fresh buffers of exactly `sizes` (one per
    dimension: rows, frames, ...) and the step run eagerly over them. With `graphs`: the
    kept buffers while every size fits and `match` (device, dtype) is the same; else new
    ones, captured anew: at least as large as both the request and the kept ones in every
    dimension (fewer captures as batches vary), or as requested where `match` changed.
    """

    def __init__(self, step: Callable[[Buffers], None]) -> None:
        self.step = step
        self.buffers: Buffers | None = None
        self.graphed: GraphedStep | None = None
        self.sizes: tuple[int, ...] = ()
        self.match: Hashable = None

    def get(
        self,
        sizes: tuple[int, ...],
        match: Hashable,
        allocate: Callable[[tuple[int, ...]], Buffers],
        device: torch.device,
        graphs: bool,
    ) -> tuple[Buffers, Callable[[], None]]:
        """(buffers, run one step over them): replayed from the graph where there is one."""
        if not graphs:
            buffers = allocate(sizes)
            return buffers, lambda: self.step(buffers)
        if self.buffers is not None and self.match == match:
            if all(have >= need for have, need in zip(self.sizes, sizes, strict=True)):
                return self.buffers, self.graphed
            sizes = tuple(map(max, sizes, self.sizes))
        buffers = allocate(sizes)
        self.buffers, self.sizes, self.match = buffers, sizes, match
        self.graphed = GraphedStep(lambda: self.step(buffers), device, True)
        return buffers, self.graphed


def run_steps(
    step: Callable[[], None], finished: Callable[[], bool], max_steps: int | None = None
) -> None:
    """Run `step` `REPLAYS_PER_CHECK` times between two calls of `finished()` (which waits
    for the GPU) until it says so, or `max_steps` steps have run."""
    taken = 0
    while (max_steps is None or taken < max_steps) and not finished():
        left = REPLAYS_PER_CHECK if max_steps is None else max_steps - taken
        group = min(REPLAYS_PER_CHECK, left)
        for _ in range(group):
            step()
        taken += group


_KEPT: weakref.WeakKeyDictionary[nn.Module, dict] = weakref.WeakKeyDictionary()


def kept_with(
    model: nn.Module, key: Hashable, make: Callable[[], Search], owner: object | None = None
) -> Search:
    """The search `make()` built for `model` and `key` the first time, kept with the model
    (weakly: it goes when the model goes, as long as the search refers to the model only
    through `ModelRef`) so its buffers and graph serve every batch that fits them.

    `owner` (None: none): an object whose tensors the search's graph reads in place (a
    language model's tables): the search is kept only as long as it lives too. `key`
    names it by `id` (the key must not hold it, or it would never go) and the search must
    refer to it weakly; its entry goes when it goes, before its id can name another."""
    searches = _KEPT.setdefault(model, {})
    if key not in searches:
        searches[key] = make()
        if owner is not None:
            weakref.finalize(owner, _forget, weakref.ref(model), key)
    return searches[key]


def _forget(model: weakref.ref, key: Hashable) -> None:
    """Drop the search kept for the model `model` refers to (if it still lives) and `key`."""
    alive = model()
    if alive is not None:
        _KEPT.get(alive, {}).pop(key, None)


class ModelRef(Generic[Model]):
    """A search's weak reference to its model: a search kept with its model (`kept_with`)
    must not keep the model alive. `ref()` is the model, or an error once it is gone."""

    def __init__(self, model: Model) -> None:
        self._ref = weakref.ref(model)

    def __call__(self) -> Model:
        model = self._ref()
        if model is None:
            raise RuntimeError("the model of this search was freed: build a new search")
        return model
