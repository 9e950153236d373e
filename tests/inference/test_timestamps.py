"""Word times from tokens and the output formats of `asr-transcribe --timestamps`."""

import json

import pytest

from asr.decoding.hypotheses import TimedTokens
from asr.inference.timestamps import (
    SRT_MAX_WORDS,
    Transcript,
    Word,
    render,
    to_srt,
    words_from_tokens,
    words_of_hypothesis,
    words_of_text,
)

FRAME = 0.04


def test_pieces_group_into_words_at_the_word_boundary() -> None:
    pieces = ["▁AN", "▁", "OR", "P", "HAN", "▁PLAY", "ED"]
    starts = [0.2, 0.28, 0.36, 0.44, 0.48, 0.64, 0.72]
    words = words_from_tokens(pieces, starts, FRAME)
    assert [w.word for w in words] == ["AN", "ORPHAN", "PLAYED"]
    assert [w.start for w in words] == [0.2, 0.28, 0.64]
    # a word ends one frame after its last token, never after the next word starts
    assert [w.end for w in words] == [0.24, 0.52, 0.76]


def test_a_word_ends_where_the_next_starts_when_tokens_crowd() -> None:
    words = words_from_tokens(["▁A", "▁B"], [1.0, 1.0], FRAME)  # two words in one frame
    assert words == [Word("A", 1.0, 1.0), Word("B", 1.0, 1.04)]
    assert words_from_tokens([], [], FRAME) == []
    assert words_from_tokens(["▁"], [0.5], FRAME) == []  # a bare boundary is no word
    with pytest.raises(ValueError, match="2 pieces but 1 times"):
        words_from_tokens(["▁A", "B"], [0.0], FRAME)


class _Pieces:
    PIECES = ["<blk>", "▁THE", "▁CAT", "S", "▁SAT"]

    def id_to_piece(self, idx: int) -> str:
        return self.PIECES[idx]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.PIECES[i] for i in ids).replace("▁", " ").strip()


def test_a_token_ends_its_duration_after_its_frame() -> None:
    """A TDT's tokens last their predicted durations: THE lasts 3 frames, CAT 0 (S follows
    in the same frame) and S 2, SAT 4, cut at the audio's end; a plain transducer's last
    one frame each (durations None)."""
    tdt = TimedTokens([1, 2, 3, 4], [0, 5, 5, 9], [0.9, 0.8, 0.7, 0.6], [3, 0, 2, 4])
    words = words_of_hypothesis(tdt, _Pieces(), FRAME, offset=1.0, audio_end=1.5)
    assert [(w.word, w.start, w.end) for w in words] == [
        ("THE", 1.0, 1.12),
        ("CATS", 1.2, 1.28),
        ("SAT", 1.36, 1.5),
    ]
    assert [w.confidence for w in words] == [0.9, 0.7, 0.6]
    plain = TimedTokens([1, 2, 3, 4], [0, 5, 5, 9], [0.9, 0.8, 0.7, 0.6])
    assert plain.durations == [1, 1, 1, 1]
    words = words_of_hypothesis(plain, _Pieces(), FRAME, offset=1.0)
    assert [w.end for w in words] == [1.04, 1.24, 1.4]
    with pytest.raises(ValueError, match="2 tokens, 2 frames, 2 confidences and 1 durations"):
        TimedTokens([1, 2], [0, 1], [0.5, 0.5], [1])


def _transcript(count: int, step: float = 0.5) -> Transcript:
    return Transcript.of_words(
        [Word(f"W{i}", round(i * step, 3), round(i * step + 0.3, 3)) for i in range(count)]
    )


def test_srt_cues_hold_at_most_their_words_and_seconds() -> None:
    srt = to_srt(_transcript(30), "a.wav")
    blocks = srt.strip().split("\n\n")
    assert blocks[0].splitlines() == [
        "1",
        "00:00:00,000 --> 00:00:04,800",
        " ".join(f"W{i}" for i in range(10)),  # 5 s at most: W10 would end at 5.3
    ]
    cue_words = [len(b.splitlines()[2].split()) for b in blocks]
    assert sum(cue_words) == 30 and max(cue_words) <= SRT_MAX_WORDS
    long = to_srt(_transcript(3, step=3700.0), "a.wav")  # past an hour, one cue per pause
    assert "2\n01:01:40,000 --> 01:01:40,300\nW1\n\n3\n02:03:20,000" in long


def test_ctm_json_and_text_lines() -> None:
    transcript = _transcript(2)
    assert render(transcript, "a.wav", "ctm", True) == (
        "a.wav 1 0.000 0.300 W0\na.wav 1 0.500 0.300 W1\n"
    )
    out = json.loads(render(transcript, "a.wav", "json", True))
    assert out == {
        "audio": "a.wav",
        "text": "W0 W1",
        "words": [
            {"word": "W0", "start": 0.0, "end": 0.3},
            {"word": "W1", "start": 0.5, "end": 0.8},
        ],
    }
    assert render(transcript, "a.wav", "text", False) == "a.wav\tW0 W1\n"
    assert render(transcript, "a.wav", "text", True) == "a.wav\tW0[0.00-0.30] W1[0.50-0.80]\n"


def test_formats_that_need_times_say_so() -> None:
    untimed = Transcript("HELLO THERE", words_of_text("HELLO THERE"))
    assert json.loads(render(untimed, "b.wav", "json", False)) == {
        "audio": "b.wav",
        "text": "HELLO THERE",
    }
    for output_format in ("srt", "ctm"):
        with pytest.raises(ValueError, match="b.wav: this model gives no word times"):
            render(untimed, "b.wav", output_format, True)
    with pytest.raises(ValueError, match="output format must be one of"):
        render(untimed, "b.wav", "vtt", False)
