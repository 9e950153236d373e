"""asr-plot: a run's curves and a bins file's buckets as PNG files."""

from pathlib import Path

import matplotlib.image
import pytest

from asr.data.corpus import load_cuts
from asr.plot import bins_figure, plot_bins, plot_training, read_metrics, training_figure

HEADER = "epoch,step,lr-AdamW/pg1,train/loss,train/audio_seconds_per_second,val/wer\n"


def _run(tmp_path: Path) -> Path:
    """A run stopped after step 2 and resumed from step 1 (which it logs again)."""
    for version, rows in enumerate(
        [
            ["0,0,0.001,50.0,20.0,", "0,1,0.002,40.0,21.0,", "0,2,0.003,35.0,22.0,90.0"],
            ["0,1,0.002,41.0,19.0,", "0,2,0.003,30.0,20.0,80.0", "1,3,0.003,25.0,20.5,70.0"],
        ]
    ):
        folder = tmp_path / "exp" / "csv" / f"version_{version}"
        folder.mkdir(parents=True)
        (folder / "metrics.csv").write_text(HEADER + "\n".join(rows) + "\n")
    return tmp_path / "exp"


def test_metrics_of_a_resumed_run_count_each_step_once(tmp_path: Path) -> None:
    series = read_metrics(_run(tmp_path))
    assert series["train/loss"] == [(0, 50.0), (1, 41.0), (2, 30.0), (3, 25.0)]
    assert series["val/wer"] == [(2, 80.0), (3, 70.0)]
    with pytest.raises(FileNotFoundError, match="no metrics.csv under"):
        read_metrics(tmp_path / "nothing")


def _curves(axis) -> dict[str, tuple[list[float], list[float]]]:
    """label -> (x, y) of every line of `axis`."""
    return {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
        for line in axis.get_lines()
    }


def test_training_figure_draws_each_metric_in_its_panel(tmp_path: Path) -> None:
    run = _run(tmp_path)
    fig = training_figure(run)
    assert fig.get_suptitle() == str(run)
    loss, wer, lr, speed = fig.axes
    assert [a.get_title() for a in fig.axes] == [
        "loss",
        "WER (%)",
        "learning rate",
        "audio seconds per second",
    ]
    assert {a.get_xlabel() for a in fig.axes} == {"optimizer step"}
    steps = [0, 1, 2, 3]
    assert _curves(loss) == {"train/loss": (steps, [50.0, 41.0, 30.0, 25.0])}
    assert loss.get_yscale() == "log"
    assert _curves(wer) == {"val/wer": ([2, 3], [80.0, 70.0])}
    assert _curves(lr) == {"lr-AdamW/pg1": (steps, [0.001, 0.002, 0.003, 0.003])}
    assert _curves(speed) == {"train/audio_seconds_per_second": (steps, [20.0, 19.0, 20.0, 20.5])}
    assert training_figure(run, title="demo").get_suptitle() == "demo"


def test_a_panel_without_its_metrics_says_not_logged(tmp_path: Path) -> None:
    csv = tmp_path / "metrics.csv"
    csv.write_text("epoch,step,train/loss\n0,0,5.0\n0,1,4.0\n")
    loss, wer, lr, speed = training_figure(csv).axes
    assert _curves(loss) == {"train/loss": ([0, 1], [5.0, 4.0])}
    for axis in (wer, lr, speed):
        assert len(axis.get_lines()) == 0
        assert [t.get_text() for t in axis.texts] == ["not logged"]


def test_bins_figure_shows_the_durations_and_each_edge_with_its_batch_sizes(
    tiny_corpus, tmp_path: Path
) -> None:
    bins = tmp_path / "batch_sizes.yaml"
    edges = "bucket_duration_bins:\n- [3.0, 20]\n- [3.0, 40]\n- [9.0, 90]\n"
    bins.write_text(edges + "bucket_batch_size: [8, 6, 2]\n")
    cuts = tiny_corpus.cuts("train-clean-100")
    (axis,) = bins_figure(bins, [cuts]).axes
    assert axis.get_title() == "batch_sizes.yaml: 3 buckets (batch size per bucket at each edge)"
    assert axis.get_ylabel() == "cuts"
    durations = [cut.duration for cut in load_cuts(cuts)]
    bars = axis.patches
    assert len(bars) == 60 and sum(bar.get_height() for bar in bars) == len(durations)
    assert bars[0].get_x() == pytest.approx(min(durations))
    assert bars[-1].get_x() + bars[-1].get_width() == pytest.approx(max(durations))
    assert [list(line.get_xdata()) for line in axis.get_lines()] == [[3.0, 3.0], [9.0, 9.0]]
    assert [(t.get_position()[0], t.get_text()) for t in axis.texts] == [
        (3.0, "≤20 tok: 8\n≤40 tok: 6"),
        (9.0, "≤90 tok: 2"),
    ]
    # duration-only edges without batch sizes: no histogram, no labels
    bins.write_text("bucket_duration_bins: [2.0, 5.0]\n")
    (axis,) = bins_figure(bins).axes
    assert axis.get_title() == "batch_sizes.yaml: 2 buckets"
    assert len(axis.patches) == 0 and axis.get_ylabel() == ""
    assert [list(line.get_xdata()) for line in axis.get_lines()] == [[2.0, 2.0], [5.0, 5.0]]
    assert [t.get_text() for t in axis.texts] == ["", ""]


def test_training_curves_and_buckets_are_written_as_png(tiny_corpus, tmp_path: Path) -> None:
    png = plot_training(_run(tmp_path), tmp_path / "out" / "training.png")
    height, width, _ = matplotlib.image.imread(png).shape
    assert (width, height) == (1100, 700)
    bins = tmp_path / "batch_sizes.yaml"
    edges = "bucket_duration_bins:\n- [3.0, 20]\n- [3.0, 40]\n- [9.0, 90]\n"
    bins.write_text(edges + "bucket_batch_size: [8, 6, 2]\n")
    png = plot_bins(bins, tmp_path / "bins.png", [tiny_corpus.cuts("train-clean-100")])
    assert matplotlib.image.imread(png).shape[:2] == (450, 1000)
    (tmp_path / "empty.yaml").write_text("max_tps: 12\n")
    with pytest.raises(ValueError, match="has no bucket_duration_bins"):
        plot_bins(tmp_path / "empty.yaml", tmp_path / "x.png")
