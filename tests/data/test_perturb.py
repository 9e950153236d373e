"""Speed perturbation of a training manifest: the originals plus slower and faster copies
whose audio, durations and supervisions follow the speed."""

import subprocess
import sys
from pathlib import Path

import pytest

from asr.data.corpus import load_cuts
from asr.data.perturb import perturb_speed

TRAIN = "train-clean-100"


def test_copies_at_each_speed_follow_it(tiny_corpus, tmp_path: Path) -> None:
    source = tiny_corpus.cuts(TRAIN)
    out = tmp_path / "sp.jsonl.gz"
    originals = {cut.id: cut for cut in load_cuts(source)}
    assert perturb_speed(source, out) == 3 * len(originals)
    perturbed = {cut.id: cut for cut in load_cuts(out)}
    assert set(originals) <= set(perturbed)
    first = next(iter(originals.values()))
    for factor in (0.9, 1.1):
        copy = perturbed[f"{first.id}_sp{factor}"]
        assert copy.duration == pytest.approx(first.duration / factor, abs=1e-3)
        assert copy.supervisions[0].text == first.supervisions[0].text
        assert copy.supervisions[0].duration == pytest.approx(copy.duration, abs=1e-3)
        samples = copy.load_audio().shape[-1]
        assert samples == pytest.approx(first.load_audio().shape[-1] / factor, abs=2)
    assert not (tmp_path / "sp.tmp.jsonl.gz").exists()


def test_bad_factors_and_feature_manifests_are_refused(
    tiny_corpus, feature_manifests, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="speed factors must be > 0 and not 1"):
        perturb_speed(tiny_corpus.cuts(TRAIN), tmp_path / "x.jsonl.gz", [1.0])
    with pytest.raises(ValueError, match="has features attached"):
        perturb_speed(feature_manifests[TRAIN], tmp_path / "x.jsonl.gz")
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "asr-perturb-speed"),
            "--cuts",
            str(tmp_path / "no.jsonl.gz"),
            "--output",
            str(tmp_path / "o.jsonl.gz"),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "manifest not found" in done.stderr
