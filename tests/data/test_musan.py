"""MUSAN's noise manifest from a tiny stand-in in MUSAN's layout (`<part>/<source>/*.wav`
beside `ANNOTATIONS` files, as lhotse's `prepare_musan` reads it): one cut per file of 5 s
or more, tagged with its part; an unreadable file skipped and counted; bad parts, a missing
corpus and a file at another rate named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from lhotse import load_manifest

from asr.data import musan
from asr.data.musan import main, prepare_musan_cuts

# (part, source, seconds of each file): 1-7 s, so that 5 s drops some of every part
LAYOUT = {
    "music": ("fma", (6.0, 2.0, 7.0)),
    "noise": ("free-sound", (5.0, 1.0, 5.5)),
    "speech": ("librivox", (3.0, 6.5)),
}


def _fake_musan(root: Path, rate: int = 16_000) -> Path:
    corpus = root / "musan"
    rng = np.random.default_rng(0)
    for part, (source, durations) in LAYOUT.items():
        folder = corpus / part / source
        folder.mkdir(parents=True)
        names = [f"{part}-{source}-{i:04d}" for i in range(len(durations))]
        for name, seconds in zip(names, durations, strict=True):
            audio = 0.1 * rng.standard_normal(int(seconds * rate)).astype(np.float32)
            sf.write(folder / f"{name}.wav", audio, rate)
        columns = {"music": " classical N someone", "noise": " Y", "speech": " male english"}
        (folder / "ANNOTATIONS").write_text("".join(f"{n}{columns[part]}\n" for n in names))
        (folder / "LICENSE").write_text("a licence\n")
    return corpus


def test_cuts_of_each_part_tagged_short_and_unreadable_files_left_out(tmp_path: Path) -> None:
    corpus = _fake_musan(tmp_path)
    (corpus / "noise" / "free-sound" / "noise-free-sound-0099.wav").write_bytes(
        np.random.default_rng(1).bytes(4000)
    )
    output = tmp_path / "manifests" / "musan_cuts.jsonl.gz"
    summary = prepare_musan_cuts(corpus, output)
    assert {part: counts["cuts"] for part, counts in summary["parts"].items()} == {
        "music": 2, "speech": 1, "noise": 2
    }  # fmt: skip
    assert summary["parts"]["music"]["dropped_short"] == 1
    assert summary["parts"]["noise"]["hours"] == pytest.approx(10.5 / 3600)
    assert summary["parts"]["noise"]["skipped"] == 1 and summary["parts"]["music"]["skipped"] == 0
    (skipped,) = summary["skipped"]
    assert skipped.startswith(f"{corpus}/noise/free-sound/noise-free-sound-0099.wav: ")
    cuts = load_manifest(output)
    assert sorted(cut.id for cut in cuts) == [
        "music-fma-0000", "music-fma-0002", "noise-free-sound-0000", "noise-free-sound-0002",
        "speech-librivox-0001",
    ]  # fmt: skip
    for cut in cuts:
        assert cut.custom["noise_type"] == cut.id.split("-")[0]
        assert cut.duration >= 5.0 and cut.sampling_rate == 16_000 and not cut.supervisions
    audio = cuts["noise-free-sound-0002"].load_audio()
    assert audio.shape == (1, 88_000)
    assert [p.name for p in output.parent.iterdir()] == [output.name]  # no temporary left
    # music and noise alone, every file of 1 s or more
    summary = prepare_musan_cuts(corpus, output, parts=("music", "noise"), min_seconds=1.0)
    assert {part: counts["cuts"] for part, counts in summary["parts"].items()} == {
        "music": 3, "noise": 3
    }  # fmt: skip
    assert {cut.custom["noise_type"] for cut in load_manifest(output)} == {"music", "noise"}


def test_bad_parts_missing_corpus_and_other_rates_are_named(tmp_path: Path) -> None:
    out = tmp_path / "musan_cuts.jsonl.gz"
    with pytest.raises(ValueError, match=r"unknown MUSAN part\(s\) babble; valid: music, speech"):
        prepare_musan_cuts(tmp_path, out, parts=("noise", "babble"))
    with pytest.raises(FileNotFoundError) as missing:
        prepare_musan_cuts(tmp_path / "musan", out)
    assert str(missing.value).startswith(f"no MUSAN in {tmp_path}/musan (no music, speech, noise")
    assert "--download" in str(missing.value)
    corpus = _fake_musan(tmp_path / "16k")
    with pytest.raises(ValueError, match=r"no MUSAN file of 60 s or more in .*16k/musan"):
        prepare_musan_cuts(corpus, out, min_seconds=60)
    with pytest.raises(ValueError, match=r"out\.gz: a cut manifest is written as \.jsonl\.gz"):
        prepare_musan_cuts(corpus, tmp_path / "out.gz")
    corpus = _fake_musan(tmp_path / "8k", rate=8000)
    with pytest.raises(ValueError, match=r"music-fma-0000.wav: 8000 Hz, not the 16000 Hz"):
        prepare_musan_cuts(corpus, out)
    assert not out.exists()


def test_download_when_the_corpus_is_missing(tmp_path: Path, monkeypatch) -> None:
    """`download_dir` given and no MUSAN in `corpus_dir`: lhotse's download_musan (here a
    stand-in writing the fake corpus) is called, and its directory read."""
    calls = []

    def download(target_dir):
        calls.append(Path(target_dir))
        return _fake_musan(Path(target_dir))

    monkeypatch.setattr(musan.lhotse_musan, "download_musan", download)
    out = tmp_path / "musan_cuts.jsonl.gz"
    summary = prepare_musan_cuts(tmp_path / "musan", out, download_dir=tmp_path)
    assert calls == [tmp_path] and summary["corpus_dir"] == str(tmp_path / "musan")
    prepare_musan_cuts(tmp_path / "musan", out, download_dir=tmp_path)  # there: no download
    assert calls == [tmp_path]


def test_command_line_prints_a_line_per_part(tmp_path: Path, capsys, monkeypatch) -> None:
    corpus = _fake_musan(tmp_path)
    out = tmp_path / "m" / "musan_cuts.jsonl.gz"
    main(["--corpus-dir", str(corpus), "-o", str(out), "--parts", "music", "noise"])
    printed = capsys.readouterr().out.splitlines()
    printed = [line for line in printed if not line.startswith("Reading MUSAN")]  # rich's bars
    assert printed[0] == "music: 2 cuts, 0.00 h (1 shorter than 5 s left out)"
    assert printed[1] == "noise: 2 cuts, 0.00 h (1 shorter than 5 s left out)"
    assert printed[2] == f"wrote {out}; 0 unreadable file(s) skipped"
    monkeypatch.setattr("sys.argv", ["asr-prepare-musan"])
    with pytest.raises(SystemExit) as stop:
        main(["--corpus-dir", str(tmp_path / "none"), "-o", str(out)])
    assert stop.value.code == 1
    error = capsys.readouterr().err
    assert error.startswith(f"asr-prepare-musan: error: no MUSAN in {tmp_path}/none")
    with pytest.raises(SystemExit):
        main(["--corpus-dir", str(tmp_path / "elsewhere"), "--download", "-o", str(out)])
    assert f"give that as --corpus-dir, not {tmp_path}/elsewhere" in capsys.readouterr().err
