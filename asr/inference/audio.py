"""Audio for transcription: any file lhotse reads, or an array, as mono 16 kHz float32,
whole (`read_audio`) or a piece at a time (`open_audio`), so that a long recording is
never held in memory at once where the format allows seeking (WAV, FLAC, ...)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from lhotse import Recording

from asr.data.features import to_mono
from asr.errors import first_line
from asr.frames import SAMPLE_RATE

AudioInput = str | Path | np.ndarray


def audio_error(err: BaseException) -> str:
    """The reason an audio file could not be read, short: lhotse lists every backend it
    tried on one line; libsndfile's (the first) is the one that matters for FLAC/WAV."""
    text = str(err)
    found = re.search(r"LibsndfileError'>: (.*)", text)  # one line of lhotse's list
    return found.group(1).strip() if found else first_line(err)


@dataclass
class AudioSource:
    """One recording, read in pieces: `duration` seconds at 16 kHz (resampled if need be)."""

    name: str
    duration: float
    _recording: Recording | None = None
    _samples: np.ndarray | None = None

    def in_memory(self) -> AudioSource:
        """The same recording read whole once, its pieces then sliced from memory."""
        if self._samples is not None:
            return self
        return AudioSource(self.name, self.duration, _samples=self.read())

    def read(self, start: float = 0.0, end: float | None = None) -> np.ndarray:
        """Mono float32 samples from `start` to `end` seconds (None: to the end)."""
        end = self.duration if end is None else min(end, self.duration)
        if self._samples is not None:
            return self._samples[round(start * SAMPLE_RATE) : round(end * SAMPLE_RATE)]
        assert self._recording is not None
        if end <= start:
            return np.zeros(0, np.float32)
        try:
            duration = None if end >= self.duration else end - start
            audio = self._recording.load_audio(offset=start, duration=duration)
        except Exception as err:
            raise ValueError(f"cannot read audio {self.name}: {audio_error(err)}") from err
        return to_mono(audio)


def open_audio(audio: AudioInput) -> AudioSource:
    """An `AudioSource` over a file (only its header is read here) or 16 kHz samples."""
    if not isinstance(audio, str | Path):
        samples = to_mono(np.asarray(audio, np.float32))
        return AudioSource("<array>", len(samples) / SAMPLE_RATE, _samples=samples)
    path = Path(audio)
    if not path.is_file():
        raise FileNotFoundError(f"audio file not found: {path}")
    try:
        recording = Recording.from_file(path)
        if recording.sampling_rate != SAMPLE_RATE:
            recording = recording.resample(SAMPLE_RATE)
    except Exception as err:
        raise ValueError(f"cannot read audio {path}: {audio_error(err)}") from err
    return AudioSource(str(path), recording.duration, _recording=recording)


def read_audio(path: str | Path) -> np.ndarray:
    """Mono float32 samples at 16 kHz of any file lhotse reads (resampled, channels averaged)."""
    return open_audio(path).read()
