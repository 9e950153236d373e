"""asr-plot: a run's curves and a bins file's buckets as PNG files."""

from pathlib import Path

import matplotlib.image
import pytest

from asr.plot import plot_bins, plot_training, read_metrics

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
