"""Shar shards written from cut manifests (`asr-export-shar`): an unreadable cut skipped and
named, the cut lists and the tars aligned, the shards listed by number, locally and over
HTTP (a `python -m http.server` on 127.0.0.1)."""

from __future__ import annotations

import gzip
import io
import json
import logging
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

from asr.data.features import precompute_features
from asr.data.shar import INDEX, export_shar, local_http_server, shar_fields

SAMPLE_RATE = 16000
NUM_CUTS = 25  # one of them corrupt: 24 written, 12 shards of 2
BAD = "utt07"


def _corpus(root: Path, count: int, suffix: str = "flac") -> Path:
    """`count` short 16-bit recordings (noise of different lengths) with one transcript
    each, as a cut manifest; returns the manifest."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    recordings, supervisions = [], []
    for i in range(count):
        samples = (rng.standard_normal(SAMPLE_RATE // 5 + 160 * i) * 3000).astype(np.int16)
        path = root / f"utt{i:02d}.{suffix}"
        sf.write(path, samples, SAMPLE_RATE)
        recording = Recording.from_file(path)
        recordings.append(recording)
        supervisions.append(
            SupervisionSegment(
                id=recording.id,
                recording_id=recording.id,
                start=0.0,
                duration=recording.duration,
                text=f"WORD NUMBER {i}",
            )  # fmt: skip
        )
    cuts = CutSet.from_manifests(
        RecordingSet.from_recordings(recordings), SupervisionSet.from_segments(supervisions)
    ).modify_ids(lambda cut_id: cut_id.rsplit("-", 1)[0])  # utt07-7 -> utt07
    manifest = root / "cuts.jsonl.gz"
    cuts.to_file(manifest)
    return manifest


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A manifest of `NUM_CUTS` FLAC cuts, the FLAC of `BAD` truncated (written after the
    manifest, as a file damaged on disk)."""
    manifest = _corpus(tmp_path_factory.mktemp("shar") / "corpus", NUM_CUTS)
    bad = manifest.parent / f"{BAD}.flac"
    bad.write_bytes(bad.read_bytes()[:2000])
    return manifest


@pytest.fixture(scope="module")
def exported(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("exported") / "shar"
    export_shar(CutSet.from_file(corpus), out, shard_size=2)
    return out


def _good_cuts(corpus: Path) -> list:
    return [cut for cut in CutSet.from_file(corpus) if cut.id != BAD]


def test_a_corrupt_cut_is_skipped_named_and_never_written(
    corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="asr.data.shar"):
        export = export_shar(CutSet.from_file(corpus), tmp_path / "shar", shard_size=2)
    assert (export.cuts, export.skipped, export.skipped_ids) == (NUM_CUTS - 1, 1, (BAD,))
    assert export.shards == 12 and export.fields["recording"][-1] == "recording.000011.tar"
    warnings = [r.getMessage() for r in caplog.records if r.name == "asr.data.shar"]
    assert warnings[0].startswith(f"{BAD}: unreadable audio (AudioLoadingError: ")
    assert warnings[-1] == f"skipped 1 unreadable cut(s), not written: {BAD}"
    good = _good_cuts(corpus)
    assert export.duration == pytest.approx(sum(cut.duration for cut in good))


def test_cut_lists_and_tars_are_aligned_and_the_audio_is_the_input(
    corpus: Path, exported: Path
) -> None:
    fields = shar_fields(str(exported))
    assert list(fields) == ["cuts", "recording"] and len(fields["cuts"]) == 12
    good = _good_cuts(corpus)
    # on disk: each shard's cut list and tar hold the same cuts, in the same order
    ids = [cut.id for cut in good]
    for number, (cuts_path, tar_path) in enumerate(zip(*fields.values(), strict=True)):
        with gzip.open(cuts_path, "rt") as f:
            listed = [json.loads(line)["id"] for line in f]
        with tarfile.open(tar_path) as tar:
            members = [Path(name).stem for name in tar.getnames()[::2]]  # data, then its json
        assert listed == members == ids[2 * number : 2 * number + 2]
    # read back by lhotse: ids, durations, transcripts and (lossless FLAC) every sample
    back = list(CutSet.from_shar(fields=fields))
    assert [cut.id for cut in back] == ids
    for original, read in zip(good, back, strict=True):
        assert read.duration == original.duration
        assert read.supervisions[0].text == original.supervisions[0].text
        np.testing.assert_array_equal(read.load_audio(), original.load_audio())


def test_the_index_lists_the_shards_and_the_counts(exported: Path) -> None:
    index = json.loads((exported / INDEX).read_text())
    assert index["fields"] == {
        "cuts": [f"cuts.{n:06d}.jsonl.gz" for n in range(12)],
        "recording": [f"recording.{n:06d}.tar" for n in range(12)],
    }
    counts = ("cuts_written", "cuts_skipped", "shards", "shard_size")
    assert [index[key] for key in counts] == [24, 1, 12, 2]
    assert index["duration_seconds"] > 0
    assert shar_fields(str(exported))["cuts"] == [
        str(exported / name) for name in index["fields"]["cuts"]
    ]


def test_without_an_index_the_shards_are_listed_by_number(
    corpus: Path, exported: Path, tmp_path: Path
) -> None:
    """Numbered past 999999, where sorting the names as text puts 1000000 before 999999."""
    copy = tmp_path / "renumbered"
    copy.mkdir()
    for path in exported.iterdir():
        if path.name != INDEX:
            field, number, ext = path.name.split(".", 2)
            (copy / f"{field}.{999_990 + int(number)}.{ext}").write_bytes(path.read_bytes())
    fields = shar_fields(str(copy))
    assert [Path(p).name for p in fields["cuts"]][-3:] == [
        "cuts.999999.jsonl.gz", "cuts.1000000.jsonl.gz", "cuts.1000001.jsonl.gz"
    ]  # fmt: skip
    back = CutSet.from_shar(fields=fields)
    assert [cut.id for cut in back] == [cut.id for cut in _good_cuts(corpus)]
    # a shard missing from one field
    (copy / "recording.999995.tar").unlink()
    with pytest.raises(ValueError, match=f"Shar directory {copy}: shard 999995 is missing"):
        shar_fields(str(copy))


def test_a_missing_directory_index_or_field_is_named(exported: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"Shar directory not found: {tmp_path}/none"):
        shar_fields(str(tmp_path / "none"))
    with pytest.raises(FileNotFoundError, match=f"no Shar shards .* and no {INDEX} in {tmp_path}"):
        shar_fields(str(tmp_path))
    short = tmp_path / "short"
    short.mkdir()
    index = json.loads((exported / INDEX).read_text())
    index["fields"]["recording"].pop()
    (short / INDEX).write_text(json.dumps(index))
    with pytest.raises(ValueError, match="different numbers of shards \\(cuts 12, recording 11\\)"):
        shar_fields(str(short))
    (short / INDEX).write_text("{not json")
    with pytest.raises(ValueError, match=f"{short / INDEX} is not a Shar index"):
        shar_fields(str(short))


def test_a_directory_with_shards_is_not_written_over(exported: Path) -> None:
    with pytest.raises(FileExistsError, match=f"{exported} already holds Shar shards"):
        export_shar(CutSet(), exported)


def test_stored_features_and_audio_in_the_original_codec(tmp_path: Path) -> None:
    """WAV input kept as WAV (`audio_format="original"`), stored features beside it; and
    features alone."""
    manifest = _corpus(tmp_path / "wav", 3, suffix="wav")
    with_feats = precompute_features(manifest, tmp_path / "feats.jsonl.gz")
    originals = list(CutSet.from_file(with_feats))
    both = export_shar(
        CutSet.from_file(with_feats), tmp_path / "both", fields=["recording", "features"],
        shard_size=2, audio_format="original",
    )  # fmt: skip
    assert list(both.fields) == ["cuts", "recording", "features"] and both.shards == 2
    with tarfile.open(tmp_path / "both" / "recording.000000.tar") as tar:
        first = tar.extractfile(tar.getmembers()[0]).read()
    assert sf.info(io.BytesIO(first)).format == "WAV"
    back = list(CutSet.from_shar(fields=shar_fields(str(tmp_path / "both"))))
    for original, read in zip(originals, back, strict=True):
        np.testing.assert_array_equal(read.load_audio(), original.load_audio())
        # lilcom-compressed again at the same step: within half a step
        np.testing.assert_allclose(read.load_features(), original.load_features(), atol=2**-6)
    export_shar(CutSet.from_file(with_feats), tmp_path / "feats", fields="features")
    back = list(CutSet.from_shar(fields=shar_fields(str(tmp_path / "feats"))))
    assert [cut.id for cut in back] == [cut.id for cut in originals]
    np.testing.assert_allclose(back[2].load_features(), originals[2].load_features(), atol=2**-6)
    with pytest.raises(ValueError, match="cut utt00 has no stored features"):
        export_shar(CutSet.from_file(manifest), tmp_path / "none", fields="features")


def _command(*args: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "asr-export-shar"
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=120)


def test_the_command_writes_shards_and_names_a_missing_manifest(
    corpus: Path, tmp_path: Path
) -> None:
    out = tmp_path / "shar"
    done = _command(str(corpus), "-o", str(out), "--shard-size", "5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("wrote 24 cuts (")
    assert done.stdout.rstrip().endswith(
        f"1 unreadable skipped) in 5 shards of recording to {out} (index: {out / INDEX})"
    )
    assert f"{BAD}: unreadable audio" in done.stderr
    assert json.loads((out / INDEX).read_text())["shards"] == 5
    missing = tmp_path / "missing.jsonl.gz"
    done = _command(str(corpus), str(missing), "-o", str(tmp_path / "other"))
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"asr-export-shar: error: manifest not found: {missing}")


@pytest.fixture
def served(exported: Path) -> Iterator[str]:
    """The URL of `exported`'s parent, served on 127.0.0.1."""
    with local_http_server(exported.parent) as url:
        yield url


def test_shards_are_read_over_http_from_the_index(
    corpus: Path, exported: Path, served: str
) -> None:
    url = f"{served}/{exported.name}"
    fields = shar_fields(url + "/")
    assert fields["recording"][:2] == [f"{url}/recording.000000.tar", f"{url}/recording.000001.tar"]
    back = list(CutSet.from_shar(fields=fields))  # lhotse opens URLs with smart_open
    good = _good_cuts(corpus)
    assert [cut.id for cut in back] == [cut.id for cut in good]
    for original, read in zip(good, back, strict=True):
        np.testing.assert_array_equal(read.load_audio(), original.load_audio())
    with pytest.raises(FileNotFoundError, match=f"cannot read {served}/none/{INDEX} \\(HTTP 404"):
        shar_fields(f"{served}/none")
