import logging
import os
import re
import shutil
from pathlib import Path

import pytest
from lhotse import MonoCut, SupervisionSegment

from asr.data.corpus import (
    cut_text,
    cuts_path,
    librispeech_parts,
    load_cuts,
    main,
    prepare_manifests,
)

PARTS = ("dev-clean", "test-clean", "train-clean-100")


def test_manifests_match_the_transcripts(tiny_corpus) -> None:
    for part in PARTS:
        transcripts = tiny_corpus.transcripts(part)
        cuts = list(load_cuts(tiny_corpus.cuts(part)))
        # Cut id == utterance id, one cut per transcript line, with its text.
        assert {c.id: c.supervisions[0].text for c in cuts} == transcripts
        assert all(len(c.supervisions) == 1 and c.recording_id == c.id for c in cuts)
        assert all(c.sampling_rate == 16_000 and c.duration > 0.5 for c in cuts)
        for kind in ("recordings", "supervisions"):
            assert (tiny_corpus.manifests / f"librispeech_{kind}_{part}.jsonl.gz").is_file()
    assert "1001-11001-0000" in tiny_corpus.transcripts("train-clean-100")
    cut = next(iter(load_cuts(tiny_corpus.cuts("test-clean"))))
    words = [item for item in cut.supervisions[0].alignment["word"] if item.symbol]
    assert " ".join(w.symbol for w in words) == cut.supervisions[0].text  # the word times


def test_newer_transcripts_make_a_part_again(tiny_corpus, tmp_path: Path, caplog) -> None:
    root = tmp_path / "LibriSpeech"
    shutil.copytree(tiny_corpus.librispeech / "dev-clean", root / "dev-clean")
    out = tmp_path / "manifests"
    prepare_manifests(root, out)
    bad = sorted(root.rglob("*.alignment.txt"))[0]
    bad.write_text("not an alignment\n")  # a rebuilt corpus, with one broken file
    later = (out / "librispeech_cuts_dev-clean.jsonl.gz").stat().st_mtime + 2
    os.utime(bad, (later, later))  # newer, whatever the file system's time resolution
    with caplog.at_level(logging.INFO, logger="asr.data.corpus"):
        report = prepare_manifests(root, out)["dev-clean"]
    assert "older than the transcripts of dev-clean: preparing it again" in caplog.text
    assert f"{bad}: not a word alignment file, ignored" in caplog.text
    assert report.utterances == len(tiny_corpus.transcripts("dev-clean"))
    aligned = [c for c in load_cuts(out / "librispeech_cuts_dev-clean.jsonl.gz")]
    without = {c.id for c in aligned if c.supervisions[0].alignment is None}
    assert without == {
        line.split()[0]
        for line in bad.with_name(bad.name.replace(".alignment.txt", ".trans.txt"))
        .read_text()
        .splitlines()
    }


def test_rerun_skips_existing_parts(tiny_corpus, caplog: pytest.LogCaptureFixture) -> None:
    before = {p: tiny_corpus.cuts(p).stat().st_mtime_ns for p in PARTS}
    with caplog.at_level(logging.INFO, logger="asr.data.corpus"):
        reports = prepare_manifests(tiny_corpus.librispeech, tiny_corpus.manifests)
    assert sorted(reports) == sorted(PARTS)
    for part, report in reports.items():
        assert report.utterances == len(tiny_corpus.transcripts(part))
        assert report.skipped == []
        assert tiny_corpus.cuts(part).stat().st_mtime_ns == before[part]
        assert f"skipping {part}" in caplog.text


@pytest.fixture
def damaged_dev(tiny_corpus, tmp_path: Path) -> tuple[Path, str, str]:
    """A copy of dev-clean with one FLAC overwritten by garbage and one empty transcript."""
    root = tmp_path / "LibriSpeech"
    shutil.copytree(tiny_corpus.librispeech / "dev-clean", root / "dev-clean")
    flac = sorted(root.rglob("*.flac"))[0]
    flac.write_bytes(b"this is not a flac file" * 64)
    trans = sorted(root.rglob("*.trans.txt"))[-1]
    lines = trans.read_text().splitlines()
    empty_id = lines[0].split(" ")[0]
    lines[0] = f"{empty_id} "
    trans.write_text("\n".join(lines) + "\n")
    assert flac.stem != empty_id
    return root, flac.stem, empty_id


def test_corrupt_audio_and_empty_transcript_are_skipped_and_reported(
    tiny_corpus, damaged_dev, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, corrupt_id, empty_id = damaged_dev
    with caplog.at_level(logging.WARNING, logger="asr.data.corpus"):
        report = prepare_manifests(root, tmp_path / "manifests", parts=["dev-clean"])["dev-clean"]
    expected = set(tiny_corpus.transcripts("dev-clean")) - {corrupt_id, empty_id}
    assert report.utterances == len(expected)
    assert len(report.skipped) == 2
    reasons = dict(reason.split(": ", 1) for reason in report.skipped)
    assert sorted(reasons) == sorted([corrupt_id, empty_id])
    assert reasons[corrupt_id].startswith("unreadable audio")
    assert reasons[empty_id].startswith("empty transcript")
    cut_ids = {c.id for c in load_cuts(cuts_path(tmp_path / "manifests", "dev-clean"))}
    assert cut_ids == expected
    assert f"skipped {corrupt_id}" in caplog.text and f"skipped {empty_id}" in caplog.text


def test_missing_corpus_dir_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "LibriSpeech"
    with pytest.raises(FileNotFoundError, match="corpus directory not found") as err:
        prepare_manifests(missing, tmp_path / "manifests")
    assert str(missing) in str(err.value)
    assert not (tmp_path / "manifests").exists()


def test_corpus_dir_without_parts_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no LibriSpeech part directory"):
        prepare_manifests(tmp_path, tmp_path / "manifests")
    with pytest.raises(FileNotFoundError, match="part directory not found"):
        prepare_manifests(tmp_path, tmp_path / "manifests", parts=["dev-other"])


def test_load_cuts_of_missing_manifest_names_path_and_stage(tmp_path: Path) -> None:
    missing = cuts_path(tmp_path, "dev-clean")
    assert missing == tmp_path / "librispeech_cuts_dev-clean.jsonl.gz"
    with pytest.raises(FileNotFoundError) as err:
        load_cuts(missing)
    assert str(missing) in str(err.value)
    assert "'manifests' stage" in str(err.value)


def test_command_line_prints_one_line_per_part(
    tiny_corpus, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    shutil.copytree(tiny_corpus.librispeech / "test-clean", tmp_path / "LS" / "test-clean")
    main(["--corpus-dir", str(tmp_path / "LS"), "--output-dir", str(tmp_path / "m")])
    n = len(tiny_corpus.transcripts("test-clean"))
    last = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(rf"test-clean: {n} utterances, \d+\.\d\d h, 0 skipped", last)


def test_cut_text_joins_stripped_supervision_texts() -> None:
    sups = [
        SupervisionSegment(id=f"s{i}", recording_id="r", start=i, duration=1.0, text=text)
        for i, text in enumerate([" HELLO ", None, "", "WORLD  "])
    ]
    cut = MonoCut(id="c", start=0, duration=4.0, channel=0, supervisions=sups)
    assert cut_text(cut) == "HELLO WORLD"
    assert cut_text(MonoCut(id="e", start=0, duration=1.0, channel=0)) == ""


def test_download_part_names_expand_their_groups() -> None:
    assert librispeech_parts("mini_librispeech") == ["dev-clean-2", "train-clean-5"]
    assert librispeech_parts(["mini_librispeech"]) == ["dev-clean-2", "train-clean-5"]
    assert len(librispeech_parts(["librispeech"])) == 7  # as the recipe passes it: a list
    assert librispeech_parts(["dev-clean", "test-clean", "dev-clean"]) == [
        "dev-clean",
        "test-clean",
    ]
    with pytest.raises(ValueError, match=r"unknown LibriSpeech part\(s\) \['train-clean-99'\]"):
        librispeech_parts(["train-clean-99"])


def test_the_lm_text_is_downloaded_unless_it_is_there(tmp_path: Path, monkeypatch, capsys) -> None:
    """`--lm-text FILE`: openslr.org/11's LM text fetched with lhotse's resumable download
    into FILE.part, renamed when complete; a file at FILE (the recipe's stand-in, or an
    earlier download) is kept and nothing is fetched."""
    import lhotse.utils

    fetched = []

    def download(url, filename, **_):
        fetched.append(url)
        Path(filename).write_bytes(b"THE TEXT\n")

    monkeypatch.setattr(lhotse.utils, "resumable_download", download)
    text = tmp_path / "lm" / "librispeech-lm-norm.txt.gz"
    main(["--lm-text", str(text)])  # alone: no --corpus-dir needed, nothing else done
    assert fetched == ["http://www.openslr.org/resources/11/librispeech-lm-norm.txt.gz"]
    assert text.read_bytes() == b"THE TEXT\n" and not text.with_name(text.name + ".part").exists()
    assert capsys.readouterr().out == f"LM text: {text}\n"
    main(["--lm-text", str(text)])
    assert len(fetched) == 1  # there: not fetched again
    with pytest.raises(SystemExit):
        main([])  # neither --corpus-dir nor --lm-text
    assert "--corpus-dir (or --lm-text)" in capsys.readouterr().err
