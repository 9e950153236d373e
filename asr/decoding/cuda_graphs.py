"""A decoding step over static tensors, replayed from a CUDA graph where it can be.

A greedy search runs the same few dozen small kernels once per token; at batch 32 on a
GPU each takes microseconds and launching them from Python takes longer than running
them. A CUDA graph records the step's kernels once and relaunches all of them with one
call (`torch.cuda.CUDAGraph`). What it needs of the step: it reads and writes only
tensors that live as long as the graph (every change in place), it never waits for the
GPU (no `.item()`, `bool(tensor)`, `.tolist()`), and its shapes never change. The
searches in `asr.decoding.label_looping` and `asr.decoding.aed` keep their state in such
tensors, so one function serves eager runs (CPU, tests) and graph replays (CUDA).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from asr.errors import first_line

log = logging.getLogger(__name__)

WARMUP_CALLS = 2  # before capture, on a side stream: cuBLAS handles, cuDNN plans, lazy inits


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
