"""Cutting recordings at pauses and in overlapping windows, and stitching the pieces back:
on constructed energies, and on a file of joined demo utterances whose word times the
synthesizer recorded (decoded, once, by a token-and-duration transducer)."""

from pathlib import Path

import numpy as np
import pytest
import torch

from asr.benchmarks.longform import JoinedRecording, error_summary, join_cuts, matched_starts
from asr.data.corpus import load_cuts
from asr.data.features import FeatureConfig
from asr.frames import SAMPLE_RATE
from asr.inference.audio import open_audio
from asr.inference.longform import (
    Piece,
    WindowConfig,
    batches_of,
    merge_timed,
    merge_untimed,
    segments_of,
    stitch,
    stitch_recordings,
)
from asr.inference.recognizer import Recognizer
from asr.inference.segments import (
    BLOCK_SECONDS,
    Segment,
    frame_energies,
    plan_windows,
    quiet_frames,
    recording_energies,
    speech_stretches,
)
from asr.inference.timestamps import Word
from asr.models.build import build_model

LOUD, QUIET = -2.0, -12.0  # log power: 43 dB apart, both above the -60 dBFS silence


def _energies(*runs: tuple[float, float]) -> np.ndarray:
    """Frame energies from (seconds, level) runs."""
    return np.concatenate([np.full(round(s * 100), level) for s, level in runs])


def test_windows_cover_the_recording_and_overlap_as_asked() -> None:
    assert plan_windows(12.0, 20.0, 4.0) == [(0.0, 12.0)]
    windows = plan_windows(50.0, 20.0, 4.0)
    assert windows == [(0.0, 20.0), (16.0, 36.0), (32.0, 50.0)]
    for (_, end), (start, _) in zip(windows, windows[1:], strict=False):
        assert end - start == 4.0


def test_stretches_are_cut_at_long_pauses_only() -> None:
    energies = _energies((1.0, QUIET), (2.0, LOUD), (0.2, QUIET), (1.0, LOUD), (1.5, QUIET))
    energies = np.concatenate([energies, _energies((3.0, LOUD), (0.5, QUIET))])
    duration = len(energies) / 100
    # the 1 s lead-in, the 1.5 s pause and the 0.5 s tail are cut; the 0.2 s pause is not
    assert speech_stretches(energies, duration, 0.3) == [(0.85, 4.35), (5.55, 8.85)]
    # keeping 0.05 s of each pause; a pause shorter than twice that is split in the middle
    assert speech_stretches(energies, duration, 0.3, keep=0.05) == [(0.95, 4.25), (5.65, 8.75)]
    assert speech_stretches(energies, duration, 0.1, keep=0.15) == [
        (0.85, 3.1), (3.1, 4.35), (5.55, 8.85)
    ]  # fmt: skip
    assert speech_stretches(energies, duration, 0.0) == [(0.0, duration)]
    assert speech_stretches(energies, duration, 2.0) == [(0.0, duration)]
    silence = np.full(500, np.log(1e-9))  # -90 dBFS: no speech at all
    assert quiet_frames(silence).all() and speech_stretches(silence, 5.0, 0.3) == []
    steady = np.full(500, LOUD)  # nothing quieter than the rest: one stretch
    assert speech_stretches(steady, 5.0, 0.3) == [(0.0, 5.0)]


def test_energies_read_in_blocks_equal_the_whole_file_s(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    samples = (rng.standard_normal(round((BLOCK_SECONDS + 7.3) * SAMPLE_RATE)) * 0.1).astype(
        np.float32
    )
    whole = frame_energies(samples)
    assert len(whole) == 1 + (len(samples) - 400) // 160
    step = np.log(np.mean(samples[160:560].astype(np.float64) ** 2))
    assert whole[1] == pytest.approx(step, abs=1e-9)
    source = open_audio(samples)
    assert np.allclose(recording_energies(source), whole, atol=1e-6)


def test_window_config_names_the_bad_value() -> None:
    with pytest.raises(ValueError, match="window must be positive"):
        WindowConfig(window=0)
    with pytest.raises(ValueError, match="overlap must be between 0 and half the window"):
        WindowConfig(window=10, overlap=6)
    with pytest.raises(ValueError, match="max_pause must be >= 0"):
        WindowConfig(max_pause=-1)
    with pytest.raises(ValueError, match="pause_pad must be >= 0"):
        WindowConfig(pause_pad=-0.1)


def _words(*items: tuple[str, float]) -> list[Word]:
    return [Word(w, s, s + 0.2) for w, s in items]


def test_timed_merge_switches_at_a_word_both_windows_heard() -> None:
    # windows [0, 20] and [16, 36] overlap on [16, 20]; the earlier garbles its last word,
    # the later its first, and the later's times differ a little
    earlier = _words(("A", 14.0), ("B", 16.5), ("C", 17.6), ("D", 18.4), ("XX", 19.8))
    later = _words(("YY", 16.0), ("B", 16.55), ("C", 17.62), ("D", 18.38), ("E", 20.1))
    merged = merge_timed(earlier, later, 16.0, 20.0)
    assert [w.word for w in merged] == ["A", "B", "C", "D", "E"]
    assert merged[2].start == 17.62  # the later window's from the switch on (C: nearest 18)
    # nothing in common: cut at the middle of the overlap
    quiet = merge_timed(
        _words(("A", 14.0), ("XX", 19.0)), _words(("YY", 16.2), ("E", 20.1)), 16, 20
    )
    assert [w.word for w in quiet] == ["A", "E"]
    # a word repeated in the overlap is neither doubled nor lost
    twice = _words(("THE", 17.0), ("THE", 17.5), ("END", 18.5))
    assert [w.word for w in merge_timed(twice, twice, 16.0, 20.0)] == ["THE", "THE", "END"]


def test_untimed_merge_aligns_the_texts() -> None:
    earlier = [Word(w) for w in ["ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN"]]
    later = [Word(w) for w in ["FIVE", "SIX", "SEVEN", "EIGHT", "NINE", "TEN"]]
    merged = merge_untimed(earlier, later, 0.3)
    assert [w.word for w in merged] == [
        "ONE",
        "TWO",
        "THREE",
        "FOUR",
        "FIVE",
        "SIX",
        "SEVEN",
        "EIGHT",
        "NINE",
        "TEN",
    ]
    assert merge_untimed(earlier[:2], later[3:], 0.3) == earlier[:2] + later[3:]


def _heard(truth: list[Word], start: float, end: float, shift: float) -> list[Word]:
    """What a decoder that makes no error inside a window would give: the words inside it,
    their times off by `shift`, and a garbled word for one cut by the window's edge."""
    heard = []
    for w in truth:
        if start <= w.start and w.end <= end:
            heard.append(Word(w.word, round(w.start + shift, 3), round(w.end + shift, 3)))
        elif w.start < end and w.end > start:
            heard.append(Word("GARBLED", max(w.start, start), min(w.end, end)))
    return heard


@pytest.fixture(scope="module")
def joined(tiny_corpus, tmp_path_factory: pytest.TempPathFactory) -> JoinedRecording:
    cuts = list(load_cuts(tiny_corpus.cuts("test-clean")))
    path = tmp_path_factory.mktemp("joined") / "joined.flac"
    return join_cuts(cuts, path, seconds=75.0, gaps=(0.5, 1.5), seed=1)


def test_joined_file_is_cut_between_its_utterances(joined: JoinedRecording) -> None:
    assert 75.0 <= joined.duration < 95.0 and joined.words
    source = open_audio(joined.path)
    segments = segments_of(source, WindowConfig())
    assert len(segments) == joined.utterances  # each utterance alone, between its gaps
    for word in joined.words:  # every word inside one segment, with its own edges
        inside = [s for s in segments if s.start <= word.start and word.end <= s.end]
        assert len(inside) == 1, word
    assert sum(s.end - s.start for s in segments) < joined.duration - 0.5 * joined.utterances


@pytest.mark.parametrize(("window", "overlap"), [(6.0, 1.0), (10.0, 2.0), (17.0, 4.0)])
def test_windows_of_one_stretch_stitch_back_to_every_word_once(
    joined: JoinedRecording, window: float, overlap: float
) -> None:
    source = open_audio(joined.path)
    segments = segments_of(source, WindowConfig(window, overlap, max_pause=0.0))
    assert len(segments) > 4 and {s.stretch for s in segments} == {0}

    pieces = [Piece(0, s, source.read(s.start, s.end)) for s in segments]
    decoded = []
    for batch in batches_of(reversed(pieces), batch_seconds=25.0, max_count=16):
        assert sum(p.segment.end - p.segment.start for p in batch[:-1]) < 25.0
        assert [len(p.samples) for p in batch] == sorted(len(p.samples) for p in batch)
        decoded += [
            (p.recording, p.segment, _heard(joined.words, p.segment.start, p.segment.end, 0.04))
            for p in batch
        ]
    assert len(decoded) == len(pieces)
    (words,) = stitch_recordings(decoded, 1, timed=True)
    assert [w.word for w in words] == [w.word for w in joined.words]
    errors = matched_starts(words, joined.words)
    assert error_summary(errors)["mean_signed_s"] == pytest.approx(0.04, abs=1e-3)


def test_stitch_puts_stretches_one_after_the_other() -> None:
    first, second = Segment(0.0, 3.0, 0), Segment(4.0, 6.0, 1)
    words = stitch([(first, _words(("A", 0.5))), (second, _words(("B", 4.5)))], timed=True)
    assert [w.word for w in words] == ["A", "B"]


def test_a_tdt_model_transcribes_a_long_recording_as_its_segments(
    joined: JoinedRecording, tokenizer
) -> None:
    """Long-form decoding needs nothing of a token-and-duration transducer: a random-weight
    TDT gives the words of its segments, decoded one by one, with ordered times that end
    inside the recording."""
    torch.manual_seed(0)
    encoder = {"input_dim": 80, "d_model": 32, "num_layers": 1, "num_heads": 2}
    encoder |= {"conv_kernel_size": 5, "subsampling_channels": 8, "dropout": 0.0}
    config = {
        "kind": "transducer",
        "encoder": encoder,
        "predictor": {"embed_dim": 32, "hidden_dim": 32, "dropout": 0.0},
        "joiner": {"joint_dim": 32, "durations": [0, 1, 2, 3, 4]},
    }
    model = build_model(config, tokenizer.vocab_size).eval()
    recognizer = Recognizer(model, tokenizer, FeatureConfig())
    (whole,) = recognizer.transcribe(joined.path, timestamps=True)
    source = open_audio(joined.path)
    segments = segments_of(source, recognizer.windows)
    assert len(segments) > 1
    one_by_one = []
    for segment in segments:
        feats = recognizer.features_of(source.read(segment.start, segment.end))
        (part,) = recognizer.transcripts_of_features([feats], [segment.start], [segment.end])
        one_by_one += part.words
    assert whole.words == one_by_one and len(whole.words) > 10
    starts = [w.start for w in whole.words]
    assert starts == sorted(starts) and starts[0] >= 0
    assert all(w.start <= w.end <= joined.duration for w in whole.words)
