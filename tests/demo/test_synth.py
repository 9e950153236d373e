import inspect
import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asr.demo.espeak import PEAK_DBFS, postprocess
from asr.demo.lexicon import CATEGORIES
from asr.demo.plan import (
    EXTRA_PARTS,
    PARTS,
    TEST_ONLY_SPEAKER,
    TRAIN_SPEAKERS,
    Speaker,
    estimate_seconds,
    plan_corpus,
)
from asr.demo.synth import MARKER, add_unlabelled_part, check_voices, main, make_demo_corpus
from asr.frames import SAMPLE_RATE

TINY = {"train_hours": 0.012, "dev_minutes": 0.25, "test_minutes": 0.3, "seed": 3}
FLAC_NAME = re.compile(r"(\d+)-(\d+)-(\d{4})\.flac")
TRANSCRIPT = re.compile(r"[A-Z']+( [A-Z']+)*")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    make_demo_corpus(out, **TINY, num_jobs=2)
    return out / "LibriSpeech"


def read_transcripts(root: Path, part: str) -> dict[str, str]:
    lines = {}
    for path in sorted((root / part).glob("*/*/*.trans.txt")):
        for line in path.read_text().splitlines():
            utt_id, text = line.split(" ", 1)
            lines[utt_id] = text
    return lines


def speakers_of(root: Path, part: str) -> set[int]:
    return {int(path.name) for path in (root / part).iterdir()}


def longest_zero_run(x: np.ndarray) -> int:
    edges = np.diff(np.concatenate([[0], (x == 0).astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return int((ends - starts).max(initial=0))


def test_layout_and_file_naming(corpus: Path) -> None:
    assert sorted(p.name for p in corpus.iterdir() if p.is_dir()) == sorted(PARTS)
    for part in PARTS:
        flacs = set()
        for speaker_dir in (corpus / part).iterdir():
            for chapter_dir in speaker_dir.iterdir():
                names = sorted(p.name for p in chapter_dir.iterdir())
                assert f"{speaker_dir.name}-{chapter_dir.name}.trans.txt" in names
                for name in names:
                    if name.endswith(".flac"):
                        match = FLAC_NAME.fullmatch(name)
                        assert match, name
                        assert match.groups()[:2] == (speaker_dir.name, chapter_dir.name)
                        flacs.add(name.removesuffix(".flac"))
        assert flacs == set(read_transcripts(corpus, part))


def test_audio_format_level_and_noise_floor(corpus: Path) -> None:
    files = sorted(corpus.glob("*/*/*/*.flac"))
    assert files
    for path in files:
        info = sf.info(path)
        assert (info.samplerate, info.channels, info.format, info.subtype) == (
            SAMPLE_RATE, 1, "FLAC", "PCM_16"
        )  # fmt: skip
        x, _ = sf.read(path, dtype="int16")
        peak_dbfs = 20 * np.log10(np.abs(x).max() / 32767)
        assert PEAK_DBFS - 0.1 < peak_dbfs <= PEAK_DBFS + 0.01
        assert longest_zero_run(x) < 16  # no exact digital silence, not even 1 ms
        lead_dbfs = 20 * np.log10(x[: SAMPLE_RATE // 10].std() / 32767)
        assert -67 < lead_dbfs < -63  # the first 0.1 s is the -65 dBFS noise floor alone


def test_transcripts_follow_the_grammar(corpus: Path) -> None:
    for part in PARTS:
        for text in read_transcripts(corpus, part).values():
            assert TRANSCRIPT.fullmatch(text), text
            assert 3 <= len(text.split()) <= 20


def test_dev_and_test_are_new_sentences_of_training_words(corpus: Path) -> None:
    train = set(read_transcripts(corpus, "train-clean-100").values())
    train_words = {word for text in train for word in text.split()}
    for part in ("dev-clean", "test-clean"):
        texts = set(read_transcripts(corpus, part).values())
        assert texts and not texts & train
        assert {word for text in texts for word in text.split()} <= train_words


def test_speakers(corpus: Path) -> None:
    train = speakers_of(corpus, "train-clean-100")
    assert len(train) >= 8
    assert speakers_of(corpus, "dev-clean") <= train
    assert speakers_of(corpus, "test-clean") - train == {TEST_ONLY_SPEAKER.id}
    speakers = (*TRAIN_SPEAKERS, TEST_ONLY_SPEAKER)
    assert len({s.voice for s in speakers}) == len(speakers)  # voice+variant all distinct
    assert len({s.id for s in speakers}) == len(speakers)


def test_same_seed_same_corpus_whatever_num_jobs(corpus: Path, tmp_path: Path) -> None:
    time.sleep(1.0)  # espeak_Initialize seeds its random generator with time(NULL)
    make_demo_corpus(tmp_path, **TINY, num_jobs=1)
    other = tmp_path / "LibriSpeech"
    files = sorted(p.relative_to(corpus) for p in corpus.glob("*/*/*/*"))
    assert files == sorted(p.relative_to(other) for p in other.glob("*/*/*/*"))
    for name in files:
        if name.suffix == ".flac":
            a, b = sf.read(corpus / name, dtype="int16")[0], sf.read(other / name, dtype="int16")[0]
            np.testing.assert_array_equal(a, b)
        else:
            assert (corpus / name).read_text() == (other / name).read_text()


def test_lhotse_reads_it(corpus: Path) -> None:
    from lhotse import CutSet
    from lhotse.recipes import prepare_librispeech

    manifests = prepare_librispeech(corpus, dataset_parts=list(PARTS))
    for part in PARTS:
        transcripts = read_transcripts(corpus, part)
        recordings, supervisions = manifests[part]["recordings"], manifests[part]["supervisions"]
        assert len(recordings) == len(supervisions) == len(transcripts)
        assert {s.id: s.text for s in supervisions} == transcripts
        # the word times: lhotse reads them as the LibriSpeech alignments
        for sup in supervisions:
            words = [item for item in sup.alignment["word"] if item.symbol]
            assert " ".join(item.symbol for item in words) == sup.text
        cuts = CutSet.from_manifests(recordings=recordings, supervisions=supervisions)
        assert len(cuts) == len(transcripts)
        assert all(r.sampling_rate == SAMPLE_RATE for r in recordings)


def test_rerun_with_same_parameters_skips(corpus: Path) -> None:
    flac = next(corpus.glob("*/*/*/*.flac"))
    mtime = flac.stat().st_mtime_ns
    summary = make_demo_corpus(corpus.parent, **TINY, num_jobs=2)
    assert summary["reused"] and flac.stat().st_mtime_ns == mtime
    assert summary["parts"]["test-clean"]["utterances"] == len(
        read_transcripts(corpus, "test-clean")
    )


def test_other_parameters_replace_the_corpus(tmp_path: Path) -> None:
    make_demo_corpus(tmp_path, **{**TINY, "seed": 4}, num_jobs=2)
    first = read_transcripts(tmp_path / "LibriSpeech", "train-clean-100")
    summary = make_demo_corpus(tmp_path, **{**TINY, "train_hours": 0.006}, num_jobs=2)
    root = tmp_path / "LibriSpeech"
    second = read_transcripts(root, "train-clean-100")
    assert not summary["reused"] and second != first and len(second) < len(first)
    flacs = {p.name.removesuffix(".flac") for p in root.glob("train-clean-100/*/*/*.flac")}
    assert flacs == set(second)  # nothing left over from the first corpus


def test_default_size_plan() -> None:
    plan = plan_corpus(train_hours=2.0, dev_minutes=6, test_minutes=10, seed=0)
    train = [utt.text.split() for utt in plan["train-clean-100"]]
    assert len({word for words in train for word in words}) >= 1000
    lengths = [len(words) for words in train]
    assert min(lengths) == 3 and max(lengths) == 20 and 9 <= np.mean(lengths) <= 11
    plural_objects = set(CATEGORIES["objects"])
    used = {word for words in train for word in words}
    assert len(plural_objects & used) > 0.9 * len(plural_objects)  # the cycling covers lists
    again = plan_corpus(train_hours=2.0, dev_minutes=6, test_minutes=10, seed=0)
    assert again == plan
    other = plan_corpus(train_hours=2.0, dev_minutes=6, test_minutes=10, seed=1)
    assert [u.text for u in other["dev-clean"]] != [u.text for u in plan["dev-clean"]]


def test_postprocess_levels_and_padding() -> None:
    sr = 22050
    tone = (8000 * np.sin(np.arange(sr // 2) * 0.1)).astype(np.int16)
    raw = np.concatenate([np.zeros(sr, np.int16), tone, np.zeros(sr, np.int16)])
    y, offset = postprocess(raw, sr, np.random.default_rng(0))
    assert abs(offset - (1.0 - 0.15)) < 0.01  # the output starts 0.15 s before the tone
    assert y.dtype == np.int16
    assert abs(len(y) / SAMPLE_RATE - (0.5 + 2 * 0.15)) < 0.01  # 1 s silences trimmed to 0.15 s
    assert abs(20 * np.log10(np.abs(y).max() / 32767) - PEAK_DBFS) < 0.01
    with pytest.raises(ValueError, match="no sound"):
        postprocess(np.zeros(sr, np.int16), sr, np.random.default_rng(0))


def test_errors_name_the_fault(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="variant 'zz9'"):
        check_voices([Speaker(1, "en-us+zz9", 170, 50, 50)])
    with pytest.raises(FileNotFoundError, match="voice 'en-xx'"):
        check_voices([Speaker(1, "en-xx+m1", 170, 50, 50)])
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(OSError, match="cannot write the demo corpus"):
        make_demo_corpus(not_a_dir, **TINY)
    foreign = tmp_path / "real" / "LibriSpeech" / "dev-clean"
    foreign.mkdir(parents=True)
    with pytest.raises(FileExistsError, match=f"no {MARKER}"):
        make_demo_corpus(tmp_path / "real", **TINY)
    with pytest.raises(ValueError, match="must be > 0"):
        make_demo_corpus(tmp_path / "x", train_hours=0)


def test_cli_prints_summary(corpus: Path, capsys: pytest.CaptureFixture) -> None:
    args = [str(corpus.parent), "--train-hours", "0.012", "--dev-minutes", "0.25"]
    main([*args, "--test-minutes", "0.3", "--seed", "3", "--num-jobs", "2"])  # reuses it
    out = capsys.readouterr().out
    assert "test-clean" in out and "voices (11)" in out and "training vocabulary" in out


@pytest.mark.slow
def test_default_size_corpus_is_planned_on_target() -> None:
    # the plan `make demo` synthesizes (make_demo_corpus's own defaults), by the estimates
    # that the next test checks against real audio: synthesizing all 2 h here took 20 s
    defaults = {
        name: p.default
        for name, p in inspect.signature(make_demo_corpus).parameters.items()
        if name in ("train_hours", "dev_minutes", "test_minutes", "seed")
    }
    assert defaults["train_hours"] == 2.0
    plan = plan_corpus(**defaults)
    seconds = {
        part: sum(estimate_seconds(u.text, u.rate) for u in utts) for part, utts in plan.items()
    }
    assert abs(seconds["train-clean-100"] / 3600 - 2.0) < 0.05
    assert abs(seconds["dev-clean"] / 60 - 6) < 0.3
    assert abs(seconds["test-clean"] / 60 - 10) < 0.5
    assert len({w for u in plan["train-clean-100"] for w in u.text.split()}) >= 1000
    assert len({u.speaker for utts in plan.values() for u in utts}) == 11


def test_estimated_durations_match_the_synthesized_audio(corpus: Path) -> None:
    summary = json.loads((corpus / MARKER).read_text())["summary"]
    plan = plan_corpus(**TINY)
    for part, utts in plan.items():
        estimated = sum(estimate_seconds(u.text, u.rate) for u in utts) / 3600
        measured = summary["parts"][part]["hours"]  # of the synthesized samples
        assert abs(measured / estimated - 1) < 0.05, (part, measured, estimated)


def test_librispeech_parts_extend_the_demo_corpus_plan() -> None:
    sizes = {"train_hours": 0.05, "dev_minutes": 1.0, "test_minutes": 1.0, "seed": 3}
    demo = plan_corpus(**sizes)
    full = plan_corpus(**sizes, librispeech_parts=True)
    assert list(full) == [*PARTS, *EXTRA_PARTS]
    for part in PARTS:  # the demo's own parts are unchanged
        assert [u.id for u in full[part]] == [u.id for u in demo[part]]
    ids = [u.id for utts in full.values() for u in utts]
    texts = [u.text for utts in full.values() for u in utts]
    assert len(set(ids)) == len(ids) and len(set(texts)) == len(texts)
    train_words = {
        w for part in PARTS[:1] + EXTRA_PARTS[:2] for u in full[part] for w in u.text.split()
    }
    known = {w for u in full["train-clean-100"] for w in u.text.split()}
    for part in ("dev-other", "test-other"):
        assert full[part] and all(set(u.text.split()) <= known for u in full[part])
    assert len(train_words) > len(known)  # the other training parts bring words of their own


def test_word_times_follow_the_audio(corpus: Path) -> None:
    """Each word's recorded start: in order, inside the file, and the first one where the
    speech starts (espeak-ng's word event is at the word's first phoneme)."""
    from lhotse.recipes.librispeech import parse_alignments

    checked = 0
    for alignment_file in sorted(corpus.glob("test-clean/*/*/*.alignment.txt")):
        for utt_id, items in parse_alignments(alignment_file).items():
            audio, rate = sf.read(alignment_file.parent / f"{utt_id}.flac", dtype="float32")
            words = [item for item in items if item.symbol]
            starts = [w.start for w in words]
            assert starts == sorted(starts) and all(w.duration >= 0 for w in words)
            assert words[-1].end <= len(audio) / rate - 0.15 + 1e-3  # the silence after
            onset = np.flatnonzero(np.abs(audio) > 0.01 * np.abs(audio).max())[0] / rate
            assert abs(starts[0] - onset) < 0.12, (utt_id, starts[0], onset)
            checked += 1
    assert checked >= 5


def test_the_unlabelled_part_plan_leaves_the_labelled_parts_as_they_were() -> None:
    from asr.data.corpus import UNLABELLED
    from asr.demo.plan import UNLABELLED_PART, UNLABELLED_SPEAKERS

    assert UNLABELLED == UNLABELLED_PART  # the manifest side and the synthesizer agree
    plain = plan_corpus(**TINY)
    both = plan_corpus(**TINY, unlabelled_hours=0.02)
    assert {part: both[part] for part in PARTS} == plain
    unlabelled = both[UNLABELLED_PART]
    labelled = {utt.text for part in PARTS for utt in both[part]}
    assert not labelled & {utt.text for utt in unlabelled}  # new sentences
    assert {utt.speaker for utt in unlabelled} <= set(UNLABELLED_SPEAKERS)
    assert not {s.id for s in UNLABELLED_SPEAKERS} & {s.id for s in TRAIN_SPEAKERS}
    seconds = sum(estimate_seconds(utt.text, utt.rate) for utt in unlabelled)
    assert 0.02 * 3600 <= seconds < 0.02 * 3600 + 10
    check_voices(UNLABELLED_SPEAKERS)  # every new voice setting exists in espeak-ng


def test_an_unlabelled_part_is_audio_alone(tmp_path: Path) -> None:
    from lhotse import load_manifest

    from asr.data.corpus import UNLABELLED, cuts_path, prepare_manifests

    summary = make_demo_corpus(tmp_path, **TINY, unlabelled_hours=0.004, num_jobs=2)
    root = tmp_path / "LibriSpeech"
    flacs = sorted((root / UNLABELLED).rglob("*.flac"))
    assert flacs and summary["parts"][UNLABELLED]["utterances"] == len(flacs)
    assert not list((root / UNLABELLED).rglob("*.txt"))  # no transcript, no alignment
    reports = prepare_manifests(root, tmp_path / "manifests")
    assert set(reports) == {*PARTS, UNLABELLED}
    cuts = load_manifest(cuts_path(tmp_path / "manifests", UNLABELLED))
    assert sorted(c.id for c in cuts) == [f.stem for f in flacs]
    assert all(not c.supervisions for c in cuts)
    total = sum(c.duration for c in cuts) / 3600
    assert total == pytest.approx(summary["parts"][UNLABELLED]["hours"], abs=1e-4)  # 4 decimals
    assert cuts[0].load_audio().shape[1] == round(cuts[0].duration * SAMPLE_RATE)
    # the labelled parts are left alone: made once, reused with or without the unlabelled one
    marker = (root / MARKER).stat().st_mtime
    again = make_demo_corpus(tmp_path, **TINY, unlabelled_hours=0.004, num_jobs=2)
    assert again["reused"] and again["parts"] == summary["parts"]
    plain = make_demo_corpus(tmp_path, **TINY, num_jobs=2)
    assert plain["reused"] and UNLABELLED in plain["parts"] and flacs[0].exists()
    bigger = make_demo_corpus(tmp_path, **TINY, unlabelled_hours=0.006, num_jobs=2)
    assert not bigger["reused"] and (root / MARKER).stat().st_mtime == marker
    assert bigger["parts"][UNLABELLED]["utterances"] > summary["parts"][UNLABELLED]["utterances"]
    assert bigger["parts"]["train-clean-100"] == summary["parts"]["train-clean-100"]


def test_add_to_existing_adds_the_unlabelled_part_with_the_corpus_own_parameters(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from asr.data.corpus import UNLABELLED

    empty = tmp_path / "empty"
    with pytest.raises(FileNotFoundError, match=f"{empty}.*no complete demo corpus"):
        add_unlabelled_part(empty, 0.004)
    with pytest.raises(SystemExit):  # the command: one line naming the folder
        main([str(empty), "--unlabelled-hours", "0.004", "--add-to-existing"])
    assert f"{empty}/LibriSpeech: no complete demo corpus" in capsys.readouterr().err
    made = make_demo_corpus(tmp_path, **TINY, num_jobs=2)  # not the command's default sizes
    root = tmp_path / "LibriSpeech"
    marker = (root / MARKER).stat().st_mtime
    main([str(tmp_path), "--unlabelled-hours", "0.004", "--add-to-existing", "--num-jobs", "2"])
    assert f"{UNLABELLED}" in capsys.readouterr().out
    assert (root / MARKER).stat().st_mtime == marker  # the labelled parts untouched
    flacs = list((root / UNLABELLED).rglob("*.flac"))
    assert flacs and not list((root / UNLABELLED).rglob("*.txt"))
    # the same part as make_demo_corpus makes for that corpus: reused, not made again
    again = make_demo_corpus(tmp_path, **TINY, unlabelled_hours=0.004, num_jobs=2)
    assert again["reused"] and again["parts"]["train-clean-100"] == made["parts"]["train-clean-100"]
    assert again["parts"][UNLABELLED]["utterances"] == len(flacs)
