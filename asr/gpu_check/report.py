"""What a section of the GPU check writes: JSON lines, each flushed as soon as it is known,
so that a section stopped by its time limit has still reported what it measured."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO


@dataclass(frozen=True)
class SectionOptions:
    """What every section is given.

    - `device`: "cuda" (the check) or "cpu" (a rehearsal: every section at toy sizes on
      the CPU, Triton interpreted and gloo in NCCL's place, to test the check's own code).
    - `work_dir`: scratch space of this section (corpora, logs, checkpoints).
    - `memory_budget`: bytes the training section's batch-size search may use.
    - `limit_s`: the runner's time limit for this section in seconds (it is stopped then;
      sections that fit their work to it plan with it). Infinite outside the runner.
    """

    device: str
    work_dir: Path
    memory_budget: int
    limit_s: float = math.inf

    @property
    def rehearsal(self) -> bool:
        return self.device != "cuda"


def _plain(value: Any) -> Any:
    """JSON-ready: floats rounded to 6 significant digits (inf/nan as strings), tuples as
    lists, paths as strings, numpy and torch scalars as numbers."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        value = value.item()
    if isinstance(value, float):
        return float(f"{value:.6g}") if math.isfinite(value) else str(value)
    return value


class Report:
    """The JSON lines of one section: `record` writes one at once; `fail` records a fault
    (the section fails), `warn` a measured target that was missed (the section still
    passes); `finish` writes the summary line the runner reads the section's status from."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.failures: list[str] = []
        self.warnings: list[str] = []

    def record(self, record: str, **fields: Any) -> None:
        self.stream.write(json.dumps(_plain({"record": record, **fields})) + "\n")
        self.stream.flush()

    def fail(self, message: str) -> None:
        self.failures.append(message)
        self.record("failure", message=message)

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        self.record("warning", message=message)

    def finish(self) -> None:
        self.record("summary", failures=self.failures, warnings=self.warnings)
