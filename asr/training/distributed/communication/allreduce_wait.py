"""A debug measurement of plain DDP (`debug.step_times_dir`): how long each rank waits in
the gradient all-reduce for the others.

`timed_allreduce_hook` does what DDP's default hook does (each bucket averaged over the
ranks) and notes on an `AllReduceClock`, on this rank's `perf_counter`, when it launched
its last bucket and when the last all-reduce completed. Once a rank has launched its last
bucket it has nothing left to do but wait for the slowest rank's gradients, so the time
from that launch to the last completion is its wait in the step (plus the last bucket's
own transfer). `asr.training.step_times.StepTimes` writes it per optimizer step.

Host-side times: with gloo (CPU processes) an all-reduce completes on gloo's threads when
its data has arrived. With NCCL a future completes once the work is queued on the GPU
stream, so the figure there is not the wait on the device.
"""

from __future__ import annotations

import threading
import time

import torch
import torch.distributed as dist
from torch import Tensor

from asr.training.distributed.communication.hooks import comm_hook


class AllReduceClock:
    """When this rank last launched a bucket's all-reduce and when the last one completed
    (completions are noted on the backend's threads, hence the lock)."""

    def __init__(self, process_group: dist.ProcessGroup | None = None) -> None:
        self.process_group = process_group
        self._lock = threading.Lock()
        self._last_launch: float | None = None
        self._last_completion: float | None = None

    def launched(self, at: float | None = None) -> None:
        """A bucket's all-reduce starts now (or `at`)."""
        with self._lock:
            self._last_launch = time.perf_counter() if at is None else at

    def completed(self, at: float | None = None) -> None:
        """A bucket's all-reduce completed now (or `at`)."""
        now = time.perf_counter() if at is None else at
        with self._lock:
            if self._last_completion is None or now > self._last_completion:
                self._last_completion = now

    def take_wait(self) -> float | None:
        """Seconds from the last launch to the last completion since the previous call (the
        latest backward pass's wait), and forget both; None when no all-reduce ran."""
        with self._lock:
            launch, completion = self._last_launch, self._last_completion
            self._last_launch = self._last_completion = None
        if launch is None or completion is None:
            return None
        return max(completion - launch, 0.0)


@comm_hook
def timed_allreduce_hook(
    clock: AllReduceClock, bucket: dist.GradBucket
) -> torch.futures.Future[Tensor]:
    """DDP's default all-reduce (torch's `default_hooks.allreduce_hook`: the bucket averaged
    over the ranks), its launch and completion noted on `clock`."""
    group = clock.process_group
    buffer = bucket.buffer().div_(dist.get_world_size(group))
    clock.launched()
    work = dist.all_reduce(buffer, group=group, async_op=True)

    def done(fut: torch.futures.Future) -> Tensor:
        clock.completed()
        return fut.value()[0]

    return work.get_future().then(done)
