"""espeak-ng through ctypes: speech samples and each word's time, for the demo corpus.

`Espeak.synthesize` returns int16 samples at espeak's rate (22,050 Hz) with the start of
every word from espeak-ng's word events (`espeakEVENT_WORD`, the time in ms of the word's
first phoneme within the generated audio). `postprocess` brings the samples to the
corpus's level and rate, and says how far it moved them, so `word_times` can place each
word in the final file. A word ends where the next begins (or where the speech ends).
"""

from __future__ import annotations

import ctypes
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import espeakng_loader
import numpy as np

from asr.frames import SAMPLE_RATE

PEAK_DBFS = -3.0
SILENCE_PAD = 0.15  # seconds of (noise-filled) silence kept before and after speech
LOUD_FRACTION = 0.01  # a sample louder than this fraction of the peak is speech

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000  # report errors instead of calling exit()
_POS_CHARACTER, _CHARS_UTF8 = 1, 1
_RATE, _PITCH, _RANGE = 1, 3, 4  # espeak_PARAMETER
_EVENT_LIST_TERMINATED, _EVENT_WORD, _EVENT_END = 0, 1, 5  # espeak_EVENT_TYPE


class _Event(ctypes.Structure):
    """espeak_EVENT of speak_lib.h."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),  # 1-based, in characters
        ("length", ctypes.c_int),  # the word's length in characters
        ("audio_position", ctypes.c_int),  # ms within the generated speech
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),  # a union of int, const char* and char[8]
    ]


_SynthCallback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event)
)


@dataclass(frozen=True)
class WordEvent:
    """A word of the text (`start_char`: where it starts in it) and the time its first
    phoneme starts in espeak's output, in seconds."""

    start_char: int
    seconds: float


@dataclass(frozen=True)
class Speech:
    """espeak's output: int16 `samples` at `sample_rate`, the words' events in order and
    the time the speech ended (the end event), in seconds."""

    samples: np.ndarray
    sample_rate: int
    words: list[WordEvent]
    end_seconds: float


class Espeak:
    """espeak-ng through ctypes. One per process: the library keeps global state."""

    def __init__(self) -> None:
        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        # text, size, position, position_type, end_position, flags, unique_identifier, user_data
        u, i, p = ctypes.c_uint, ctypes.c_int, ctypes.c_void_p
        lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, u, i, u, u, p, p]
        data = Path(espeakng_loader.get_data_path())
        # The path is the directory that holds espeak-ng-data.
        self.sample_rate = lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, 0, str(data.parent).encode(), _INITIALIZE_DONT_EXIT
        )
        if self.sample_rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed (data directory {data})")
        self._chunks: list[np.ndarray] = []
        self._words: list[WordEvent] = []
        self._end = 0.0
        self._callback = _SynthCallback(self._collect)  # keep a reference: C holds only a pointer
        lib.espeak_SetSynthCallback(self._callback)
        self._lib = lib

    def _collect(self, wav: ctypes.Array, count: int, events: ctypes.Array) -> int:
        if wav and count > 0:  # a NULL buffer marks the end of the utterance
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(count,)).copy())
        for index in range(1_000_000):  # the list ends with a terminating event
            event = events[index]
            if event.type == _EVENT_LIST_TERMINATED:
                break
            if event.type == _EVENT_WORD:
                self._words.append(WordEvent(event.text_position - 1, event.audio_position / 1000))
            elif event.type == _EVENT_END:
                self._end = event.audio_position / 1000
        return 0  # 0 = continue

    def synthesize(
        self, text: str, voice: str, *, rate: int, pitch: int, pitch_range: int, seed: int
    ) -> Speech:
        """Speak `text`.

        `seed` seeds espeak's random generator (breath noise of variants such as +f2..+f5),
        which espeak_Initialize seeds from the clock, time(NULL). The samples still depend
        on what this process synthesized before (see `asr.demo.synth`)."""
        if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ValueError(f"espeak-ng has no voice {voice!r}")
        for parameter, value in ((_RATE, rate), (_PITCH, pitch), (_RANGE, pitch_range)):
            self._lib.espeak_SetParameter(parameter, value, 0)
        self._lib.espeak_ng_SetRandSeed(seed)
        self._chunks.clear()
        self._words = []
        self._end = 0.0
        data = text.encode()
        err = self._lib.espeak_Synth(
            data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
        )
        if err != 0:
            raise RuntimeError(f"espeak_Synth failed on {text!r} with voice {voice!r}")
        self._lib.espeak_Synchronize()
        samples = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
        end = self._end or len(samples) / self.sample_rate
        return Speech(samples, self.sample_rate, list(self._words), end)


def postprocess(
    samples: np.ndarray, sample_rate: int, rng: np.random.Generator, noise_dbfs: float = -65.0
) -> tuple[np.ndarray, float]:
    """espeak's int16 output -> (int16 at 16 kHz, the time in espeak's output where it
    starts, in seconds): resample, keep SILENCE_PAD seconds around the speech,
    peak-normalize to PEAK_DBFS, add white noise of RMS `noise_dbfs` (re full scale)."""
    import torch
    from torchaudio.functional import resample

    x = resample(
        torch.from_numpy(samples.astype(np.float32) / 32768), sample_rate, SAMPLE_RATE
    ).numpy()
    loud = np.flatnonzero(np.abs(x) > LOUD_FRACTION * np.abs(x).max(initial=0.0))
    if loud.size == 0:
        raise ValueError("espeak-ng produced no sound")
    pad = round(SILENCE_PAD * SAMPLE_RATE)
    x = np.pad(x, pad)[loud[0] : loud[-1] + 2 * pad + 1]  # exactly `pad` samples either side
    peak = 10 ** (PEAK_DBFS / 20)
    x = x * (peak / np.abs(x).max()) + rng.standard_normal(len(x)) * 10 ** (noise_dbfs / 20)
    x *= min(1.0, peak / np.abs(x).max())  # the noise must not push the peak above PEAK_DBFS
    return np.round(x * 32767).astype(np.int16), (loud[0] - pad) / SAMPLE_RATE


@dataclass(frozen=True)
class TimedWord:
    """A word of a transcript and its start and end in the audio file, in seconds."""

    word: str
    start: float
    end: float


def word_times(text: str, speech: Speech, offset: float, duration: float) -> list[TimedWord]:
    """Each word of `text` (as spoken by `speech`) placed in a file that starts at
    `offset` seconds of espeak's output and lasts `duration` seconds: it starts at its
    event and ends where the next word starts (the last: where the speech ends, before the
    file's SILENCE_PAD).

    espeak-ng gives a few short word pairs one event ("in the", "of a"): the words of such
    an event share its time span in proportion to their letters. Raises if an event does
    not start at a word of the text."""
    spans = [(m.start(), m.group()) for m in re.finditer(r"\S+", text)]
    word_at = {start: i for i, (start, _) in enumerate(spans)}
    firsts = [word_at.get(w.start_char) for w in speech.words]
    if not spans or None in firsts or firsts[0] != 0 or firsts != sorted(set(firsts)):
        raise ValueError(
            f"espeak-ng's word events start at characters {[w.start_char for w in speech.words]} "
            f"of {text!r}: not at its words"
        )
    speech_end = min(speech.end_seconds - offset, duration - SILENCE_PAD)
    times = [w.seconds - offset for w in speech.words] + [speech_end]
    bounds = [*firsts, len(spans)]
    starts: list[float] = []
    for (first, stop), begin, end in zip(
        itertools.pairwise(bounds), times[:-1], times[1:], strict=True
    ):
        letters = [len(word) for _, word in spans[first:stop]]
        done = 0
        for count in letters:  # one event's words share its span by their letters
            starts.append(begin + (end - begin) * done / sum(letters))
            done += count
    timed = []
    for (_, word), start, end in zip(spans, starts, [*starts[1:], speech_end], strict=True):
        start = min(max(start, 0.0), duration)
        end = min(max(end, start), duration)
        timed.append(TimedWord(word, round(start, 3), round(end, 3)))
    return timed
