"""`asr.load_model` and the `Recognizer` (`asr.inference.recognizer`) on the bundle of the
shared training run."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import asr
from asr.inference.recognizer import read_audio

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]


def test_transcribe_path_or_array_gives_the_same_text(bundle: Path, test_flacs) -> None:
    recognizer = asr.load_model(bundle)
    samples, rate = sf.read(test_flacs[0], dtype="float32")
    assert rate == 16_000
    # the path branch reads exactly these samples ...
    assert np.array_equal(read_audio(test_flacs[0]), samples)
    texts = recognizer.transcribe([test_flacs[0], samples, str(test_flacs[1])])
    assert len(texts) == 3 and all(isinstance(t, str) for t in texts)
    # ... and both give the same text
    assert texts[0] == texts[1]
    assert recognizer.transcribe(samples) == [texts[0]]  # a single input is fine too


BLOCKED = """
import sys
for name in ("lightning", "pytorch_lightning", "hydra", "omegaconf"):
    sys.modules[name] = None  # any import of these now raises ImportError
import asr
texts = asr.load_model(sys.argv[1]).transcribe([sys.argv[2]])
assert all(sys.modules[name] is None for name in ("lightning", "hydra", "omegaconf"))
print(repr(texts))
"""


def test_load_model_needs_neither_lightning_nor_hydra(bundle: Path, test_flacs, cli) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED, str(bundle), str(test_flacs[0])],
        capture_output=True,
        text=True,
        timeout=300,
        env=cli.env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == repr(asr.load_model(bundle).transcribe([test_flacs[0]]))
