"""Where a run's CSV metrics live (`exp_dir/csv/version_N/metrics.csv`, one version per run
and resume) and how to read them back, without importing Lightning."""

from __future__ import annotations

import csv
from pathlib import Path

CSV_DIR = "csv"  # under exp_dir: the CSV logger's name


def metric_files(exp_dir: str | Path) -> list[Path]:
    """The run's metrics.csv files, oldest version first."""
    paths = (Path(exp_dir) / CSV_DIR).glob("version_*/metrics.csv")
    return sorted(paths, key=lambda p: int(p.parent.name.split("_")[-1]))


def metric_rows(exp_dir: str | Path) -> list[dict[str, str]]:
    """Every row of every version, in order (a cell is "" where a row lacks the metric)."""
    rows: list[dict[str, str]] = []
    for path in metric_files(exp_dir):
        with open(path) as f:
            rows += list(csv.DictReader(f))
    return rows
