"""`StartupGraceDDPStrategy`: Lightning's `DDPStrategy` with two timeouts, one for the
processes to find each other at start and one for every collective after.

A short `distributed.timeout` notices a hung process quickly, but the rendezvous is bounded
by the same timeout in torch: a process that takes longer to import torch and Lightning
than that (a loaded machine, a node started by hand a minute later) stopped the run before
it began. Here the rendezvous waits `startup_timeout`; then the default process group and
its store take `timeout`, and groups created later (AD-PSGD's) are created with it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from lightning.pytorch.strategies import DDPStrategy
from torch.distributed import distributed_c10d


class StartupGraceDDPStrategy(DDPStrategy):
    """`DDPStrategy` whose rendezvous waits `startup_timeout` (at least `timeout`)."""

    def __init__(
        self, *, timeout: timedelta, startup_timeout: timedelta | None = None, **kwargs: Any
    ) -> None:
        super().__init__(timeout=timeout, **kwargs)
        self.startup_timeout = max(timeout, startup_timeout or timeout)

    def setup_distributed(self) -> None:
        hang = self._timeout
        self._timeout = self.startup_timeout  # Lightning passes it to init_process_group
        try:
            super().setup_distributed()
        finally:
            self._timeout = hang
        if hang is not None and hang < self.startup_timeout:
            narrow_default_group_timeout(hang)


def narrow_default_group_timeout(timeout: timedelta) -> None:
    """Set the timeout of the default process group's collectives and of its store.

    torch has no public setter: `_set_pg_timeout` is private (checked with the pinned
    torch 2.9: a gloo all-reduce then fails after `timeout`, the rendezvous before it
    having waited longer)."""
    distributed_c10d._set_pg_timeout(timeout)
    distributed_c10d._get_default_store().set_timeout(timeout)
