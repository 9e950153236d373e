"""A GPU check section rehearsed on the CPU, and its report's records by kind: what the
section tests share."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

from asr.gpu_check.report import Report, SectionOptions


def reported(stream: io.StringIO) -> dict[str, list[dict]]:
    """The JSON lines a report wrote to `stream`, grouped by their `record` kind."""
    by_kind: dict[str, list[dict]] = {}
    for line in stream.getvalue().splitlines():
        record = json.loads(line)
        by_kind.setdefault(record["record"], []).append(record)
    return by_kind


def rehearse(run: Callable[[Report, SectionOptions], None], out: Path) -> dict[str, list[dict]]:
    """`run` (a section's `run`) on the CPU with 1 GiB, writing under `out`: its records."""
    stream = io.StringIO()
    report = Report(stream)
    run(report, SectionOptions("cpu", out, 2**30))
    report.finish()
    return reported(stream)
