"""Pictures of a run (`asr-plot`), PNG files written with matplotlib:

    asr-plot training exp/demo -o exp/demo/training.png
    asr-plot bins exp/demo/batch_sizes.yaml \\
        --cuts data/demo/manifests/librispeech_cuts_train-clean-100.jsonl.gz

`training`: the curves of a run's `csv/version_*/metrics.csv` (every version, a resumed
run's steps counted once): training and validation loss, validation (and test) WER, the
learning rate, and the training speed in seconds of audio per second.
`bins`: the durations of the training cuts as a histogram with the duration edges of the
buckets (`asr-estimate-bins` or `asr-oomptimizer` output), and the batch size of each bucket
where the file has them.
"""

from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from asr.cli import command

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Series = dict[str, list[tuple[int, float]]]  # metric -> (step, value) in step order


def read_metrics(run: str | Path) -> Series:
    """Every metric of a run (its exp_dir, its csv/ directory, or one metrics.csv), by
    step; of a step logged again by a resumed run, the later value."""
    run = Path(run)
    if run.is_file():
        files = [run]
    else:
        root = run / "csv" if (run / "csv").is_dir() else run
        files = sorted(
            root.glob("version_*/metrics.csv"), key=lambda p: int(p.parent.name.split("_")[-1])
        )
    if not files:
        raise FileNotFoundError(f"no metrics.csv under {run} (asr-train writes csv/version_N/)")
    values: dict[str, dict[int, float]] = defaultdict(dict)
    for path in files:
        with open(path) as f:
            for row in csv.DictReader(f):
                step = int(row["step"])
                for name, value in row.items():
                    if name not in ("step", "epoch") and value not in ("", None):
                        values[name][step] = float(value)
    return {name: sorted(points.items()) for name, points in values.items()}


def _plot(axis, series: Series, names: Sequence[str], title: str, log: bool = False) -> None:
    drawn = False
    for name in names:
        points = series.get(name)
        if not points:
            continue
        steps, values = zip(*points, strict=True)
        marker = "o" if len(points) < 60 else None
        axis.plot(steps, values, label=name, marker=marker, markersize=3)
        drawn = True
    axis.set_title(title)
    axis.set_xlabel("optimizer step")
    if drawn:
        axis.legend(fontsize=7)
        if log:
            axis.set_yscale("log")
    else:
        axis.text(0.5, 0.5, "not logged", ha="center", va="center", transform=axis.transAxes)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, output: str | Path) -> Path:
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=100)
    _pyplot().close(fig)
    return output


def training_figure(run: str | Path, title: str | None = None) -> Figure:
    """The matplotlib Figure of `plot_training`: four panels of a run's curves, titled
    `title` (default the run's path)."""
    plt = _pyplot()
    series = read_metrics(run)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), constrained_layout=True)
    losses = [n for n in ("train/loss", "val/loss") if n in series]
    _plot(axes[0, 0], series, losses, "loss", log=True)
    wers = [n for n in ("val/wer", "val/ctc_wer", "test/wer") if n in series]
    _plot(axes[0, 1], series, wers, "WER (%)")
    _plot(axes[1, 0], series, sorted(n for n in series if n.startswith("lr-")), "learning rate")
    _plot(axes[1, 1], series, ["train/audio_seconds_per_second"], "audio seconds per second")
    fig.suptitle(title or str(run))
    return fig


def plot_training(run: str | Path, output: str | Path, title: str | None = None) -> Path:
    """Four panels of a run's curves into `output` (PNG, titled `title`, default the run's
    path); its path."""
    return _save(training_figure(run, title), output)


def bins_figure(bins_file: str | Path, cuts: Sequence[str | Path] = ()) -> Figure:
    """The matplotlib Figure of `plot_bins`: the duration histogram of `cuts` (if given)
    with the buckets of `bins_file` and their batch sizes."""
    plt = _pyplot()
    bins_file = Path(bins_file)
    content = yaml.safe_load(bins_file.read_text()) or {}
    edges = content.get("bucket_duration_bins")
    if not edges:
        raise ValueError(f"{bins_file} has no bucket_duration_bins (asr-estimate-bins output)")
    sizes = content.get("bucket_batch_size") or [None] * len(edges)
    durations = []
    if cuts:
        from asr.data.corpus import load_cuts

        durations = [cut.duration for path in cuts for cut in load_cuts(path)]
    fig, axis = plt.subplots(figsize=(10, 4.5), constrained_layout=True)
    if durations:
        axis.hist(durations, bins=60, color="lightsteelblue")
    by_duration: dict[float, list[str]] = defaultdict(list)
    for edge, size in zip(edges, sizes, strict=True):
        duration, tokens = (edge, None) if not isinstance(edge, list) else edge
        label = f"≤{tokens} tok" if tokens is not None else ""
        if size is not None:
            label = f"{label}: {size}" if label else f"batch {size}"
        by_duration[float(duration)].append(label)
    top = axis.get_ylim()[1] if durations else 1.0
    for duration, labels in sorted(by_duration.items()):
        axis.axvline(duration, color="firebrick", linewidth=1)
        text = "\n".join(label for label in labels if label)
        axis.text(duration, top * 0.98, text, ha="right", va="top", fontsize=7, color="firebrick")
    axis.set_xlabel("cut duration (s); red: upper edge of each duration bin")
    axis.set_ylabel("cuts" if durations else "")
    title = f"{bins_file.name}: {len(edges)} buckets"
    if sizes[0] is not None:
        title += " (batch size per bucket at each edge)"
    axis.set_title(title)
    return fig


def plot_bins(bins_file: str | Path, output: str | Path, cuts: Sequence[str | Path] = ()) -> Path:
    """The duration histogram of `cuts` (if given) with the buckets of `bins_file` and
    their batch sizes into `output` (PNG); its path."""
    return _save(bins_figure(bins_file, cuts), output)


@command
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    kinds = parser.add_subparsers(dest="kind", required=True)
    training = kinds.add_parser("training", help="curves of a run's metrics.csv")
    training.add_argument("run", type=Path, help="exp_dir (or a metrics.csv)")
    training.add_argument("-o", "--output", type=Path, default=None)
    training.add_argument("--title", default=None, help="default: the run's path")
    bins = kinds.add_parser("bins", help="durations, bucket edges and batch sizes")
    bins.add_argument("bins_file", type=Path)
    bins.add_argument("--cuts", type=Path, nargs="*", default=[], help="training manifests")
    bins.add_argument("-o", "--output", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.kind == "training":
        folder = args.run if args.run.is_dir() else args.run.parent
        output = args.output or folder / "training.png"
        print(f"wrote {plot_training(args.run, output, args.title)}")
    else:
        output = args.output or args.bins_file.with_suffix(".png")
        print(f"wrote {plot_bins(args.bins_file, output, args.cuts)}")


if __name__ == "__main__":
    main()
