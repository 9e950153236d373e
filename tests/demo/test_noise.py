import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from lhotse import CutSet, load_manifest_lazy

from asr.demo.noise import (
    CHATTER_SPEAKERS,
    MARKER,
    NOISE_TYPES,
    SPLITS,
    main,
    make_demo_noise,
    manifest_path,
)
from asr.demo.plan import TEST_ONLY_SPEAKER, TRAIN_SPEAKERS, UNLABELLED_SPEAKERS
from asr.demo.synth import check_voices
from asr.frames import SAMPLE_RATE

# 14 clips of 2-3 s, one fresh process each: about a second with 2 processes (not `slow`,
# like tests/demo/test_synth.py's tiny corpus)
SMALL = {"clips_per_type": 2, "clip_seconds": (2.0, 3.0), "seed": 5}


@pytest.fixture(scope="module")
def noise_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    make_demo_noise(out, **SMALL, num_jobs=2)
    return out


def clips(root: Path, kind: str) -> list[np.ndarray]:
    split = next(s for s in SPLITS if kind in NOISE_TYPES[s])
    files = sorted((root / "noise" / split / kind).glob("*.flac"))
    assert len(files) == SMALL["clips_per_type"]
    return [sf.read(path)[0] for path in files]


def spectral_slope(x: np.ndarray) -> float:
    """Slope of log10 power vs log10 frequency over 100-4000 Hz (Welch: 2048-sample Hann
    segments, half overlapping)."""
    size = 2048
    window = np.hanning(size)
    segments = [x[i : i + size] * window for i in range(0, len(x) - size + 1, size // 2)]
    power = np.mean([np.abs(np.fft.rfft(s)) ** 2 for s in segments], axis=0)
    freqs = np.fft.rfftfreq(size, 1 / SAMPLE_RATE)
    band = (freqs >= 100) & (freqs <= 4000)
    return float(np.polyfit(np.log10(freqs[band]), np.log10(power[band]), 1)[0])


def crest_factor(x: np.ndarray) -> float:
    return float(np.abs(x).max() / np.sqrt(np.mean(x**2)))


def envelope_variation(x: np.ndarray, frame: int = 400) -> float:
    """Coefficient of variation of the 25 ms frames' energies."""
    energy = np.mean(x[: len(x) // frame * frame].reshape(-1, frame) ** 2, axis=1)
    return float(energy.std() / energy.mean())


def md5s(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.md5(p.read_bytes()).hexdigest()
        for p in sorted((root / "noise").glob("*/*/*.flac"))
    }


def test_manifests_and_audio(noise_root: Path) -> None:
    types = {}
    for split in SPLITS:
        path = manifest_path(noise_root, split)
        assert path == noise_root / "manifests" / f"noise_cuts_{split}.jsonl.gz"
        cuts = CutSet.from_file(path)
        assert len(cuts) == len(list(load_manifest_lazy(path)))
        types[split] = {cut.custom["noise_type"] for cut in cuts}
        assert types[split] == set(NOISE_TYPES[split])
        assert len(cuts) == SMALL["clips_per_type"] * len(NOISE_TYPES[split])
        for cut in cuts:
            kind = cut.custom["noise_type"]
            source = Path(cut.recording.sources[0].source)
            assert source == noise_root / "noise" / split / kind / f"{cut.id}.flac"
            assert cut.id.startswith(f"{kind}-") and not cut.supervisions
            assert cut.sampling_rate == SAMPLE_RATE and cut.num_channels == 1
            assert 2.0 <= cut.duration <= 3.0 and cut.start == 0
            audio = cut.load_audio()
            assert audio.shape == (1, cut.num_samples)
            info = sf.info(source)
            assert (info.format, info.subtype) == ("FLAC", "PCM_16")
            rms_dbfs = 20 * np.log10(np.sqrt(np.mean(audio**2)))
            assert np.abs(audio).max() <= 0.99 + 1e-4 and -60 < rms_dbfs < -24.5
    assert not types["train"] & types["test"]  # the test types are held out


def test_coloured_noise_slopes(noise_root: Path) -> None:
    for kind, slope, tolerance in (("white", 0, 0.3), ("pink", -1, 0.3), ("brown", -2, 0.4)):
        for x in clips(noise_root, kind):
            assert abs(spectral_slope(x) - slope) < tolerance, kind


def test_clicks_are_impulsive(noise_root: Path) -> None:
    white = max(crest_factor(x) for x in clips(noise_root, "white"))
    for x in clips(noise_root, "clicks"):
        kurtosis = np.mean((x - x.mean()) ** 4) / x.var() ** 2
        assert crest_factor(x) > 3 * white and kurtosis > 10


def test_tones_are_few_lines(noise_root: Path) -> None:
    for x in clips(noise_root, "tones"):
        power = np.abs(np.fft.rfft(x * np.hanning(len(x)))) ** 2
        top = np.sort(power)[::-1]
        # 1-4 sinusoids: their peaks (a few bins each) hold nearly all the power
        assert top[: len(top) // 100].sum() > 0.99 * power.sum()


def test_babble_and_chatter_are_speech_like(noise_root: Path) -> None:
    white = max(envelope_variation(x) for x in clips(noise_root, "white"))
    for kind in ("babble", "chatter"):
        for x in clips(noise_root, kind):
            assert envelope_variation(x) > max(4 * white, 0.3), kind


def test_chatter_voices_are_new() -> None:
    check_voices(CHATTER_SPEAKERS)  # every voice and variant exists
    known = {s.voice for s in (*TRAIN_SPEAKERS, TEST_ONLY_SPEAKER, *UNLABELLED_SPEAKERS)}
    assert not {s.voice for s in CHATTER_SPEAKERS} & known


def test_same_seed_same_noise_and_rerun_skips(
    noise_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    make_demo_noise(tmp_path, **SMALL, num_jobs=1)
    assert md5s(tmp_path) == md5s(noise_root)
    written = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    mtimes = [p.stat().st_mtime_ns for p in written]
    summary = make_demo_noise(tmp_path, **SMALL, num_jobs=2)
    assert "skipping" in capsys.readouterr().err
    assert [p.stat().st_mtime_ns for p in written] == mtimes
    assert summary["train"]["white"]["clips"] == SMALL["clips_per_type"]


def test_other_parameters_rebuild(noise_root: Path, tmp_path: Path) -> None:
    shutil.copytree(noise_root, tmp_path, dirs_exist_ok=True)
    before = md5s(tmp_path)
    make_demo_noise(tmp_path, **{**SMALL, "clips_per_type": 1}, num_jobs=2)
    after = md5s(tmp_path)
    assert len(after) == len(before) // 2
    assert json.loads((tmp_path / "noise" / MARKER).read_text())["params"]["clips_per_type"] == 1
    assert len(CutSet.from_file(manifest_path(tmp_path, "test"))) == len(NOISE_TYPES["test"])


def test_refuses_a_foreign_noise_folder(tmp_path: Path) -> None:
    (tmp_path / "noise").mkdir()
    with pytest.raises(FileExistsError, match="not written by make_demo_noise"):
        make_demo_noise(tmp_path, **SMALL)
    with pytest.raises(ValueError, match="clips_per_type"):
        make_demo_noise(tmp_path / "x", clips_per_type=0)


def test_cli_prints_summary(noise_root: Path, capsys: pytest.CaptureFixture) -> None:
    main([str(noise_root), "--clips-per-type", "2", "--clip-seconds", "2", "3", "--seed", "5"])
    out = capsys.readouterr().out
    assert "train: white 2 clips" in out and "babble 2 clips" in out
    assert "test: brown 2 clips" in out and "chatter 2 clips" in out
    assert str(manifest_path(noise_root, "test")) in out
