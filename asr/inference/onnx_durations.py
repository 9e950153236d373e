"""A token-and-duration transducer (TDT) in sherpa-onnx's NeMo contract: how the exported
joiner lays out its duration logits, what tells sherpa-onnx that it has them, and which
sherpa-onnx reads them.

What sherpa-onnx reads (its source, `sherpa-onnx/csrc/`; docs/export.md, "TDT"):

- `offline-transducer-nemo-model.cc` takes a NeMo transducer for TDT when the encoder's
  metadata `url` holds "tdt" (NeMo's exporters write the model's address there, such as
  .../parakeet-tdt-0.6b-v2); the joiner's last output axis then holds `vocab_size` + 1
  token logits (the blank last), then the duration logits, and the loader stops the
  process when that axis is no wider than the tokens ("It is not a TDT model!").
- `offline-transducer-greedy-search-nemo-decoder.cc` (`DecodeOneTDT`) reads the position
  of the largest duration logit as the frames to skip, so logit i must mean i frames:
  `skip_layout` gives one logit per skip from 0 to the largest duration, -inf where a
  skip was not trained. A token emitted with skip 0 stays on the frame, at most 5 tokens
  per frame; a blank moves at least one frame.
- That search came in sherpa-onnx 1.12.9 (PR #2495, August 2025), with a duration of 0 read
  as 1; `result.durations` came in 1.12.10 (PR #2514); skip 0 staying on the frame, NeMo's
  rule and this package's, in 1.12.14 (PR #2606): `SHERPA_TDT_VERSION`.
- The online recognizer's NeMo transducers (`online-transducer-greedy-search-nemo-decoder.cc`
  and the parakeet-unified one) take the largest of the `vocab_size` token logits frame by
  frame and read no duration (up to 2.0.1, the pinned version): a streaming TDT model has
  no export (`ONLINE_TDT`).
"""

from __future__ import annotations

import importlib.metadata
import re

# The encoder metadata that makes sherpa-onnx's offline NeMo transducer read durations.
TDT_URL_KEY, TDT_URL = "url", "tdt"
DURATIONS_KEY = "durations"  # this package's: the trained durations, comma-separated
SHERPA_TDT_VERSION = "1.12.14"
SHERPA_TDT_TOKENS_PER_FRAME = 5  # DecodeOneTDT's max_tokens_per_frame
NO_SKIP_LOGIT = float("-inf")  # the logit of a skip that was not trained: probability 0
ONLINE_TDT = (
    "sherpa-onnx's online recognizer does not read durations (its streaming NeMo "
    "transducer steps through every frame on the token logits alone): a streaming TDT "
    "model (model.joiner.durations) cannot be exported to ONNX"
)


def skip_layout(durations: tuple[int, ...]) -> list[int] | None:
    """The exported duration logits as positions in `durations` (the joiner's order): one
    per skip 0..max(durations), `len(durations)` (`NO_SKIP_LOGIT`, appended) for a skip
    that is not a duration. None where `durations` is 0..D-1 already (NeMo's [0, 1, 2, 3,
    4]): the joiner's own order."""
    floor = len(durations)
    layout = [durations.index(s) if s in durations else floor for s in range(max(durations) + 1)]
    return None if layout == list(range(len(durations))) else layout


def durations_of(metadata: dict[str, str]) -> tuple[int, ...] | None:
    """The trained durations an export's metadata records; None for a plain transducer."""
    value = metadata.get(DURATIONS_KEY)
    return None if not value else tuple(int(d) for d in value.split(","))


def exported_columns(vocab_size: int, durations: tuple[int, ...]) -> list[int] | None:
    """The columns of the exported joiner's logits that give back the model's: the tokens,
    then the duration logits in the order of `durations` (None: all, in order)."""
    if skip_layout(durations) is None:
        return None
    return list(range(vocab_size)) + [vocab_size + d for d in durations]


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def installed_sherpa_onnx() -> str | None:
    """The installed sherpa-onnx's version; None where it is not installed."""
    try:
        return importlib.metadata.version("sherpa-onnx")
    except importlib.metadata.PackageNotFoundError:
        return None


def sherpa_tdt_note(contract: str, installed: str | None) -> str | None:
    """Why sherpa-onnx cannot decode a TDT export in `contract` with its durations (the
    installed sherpa-onnx's version `installed`; None: not installed, nothing to say about
    it); None when it can."""
    if contract != "nemo":
        return (
            "sherpa-onnx reads durations only in NeMo's transducer contract, which needs an "
            "LSTM predictor (model.predictor.kind=lstm): asr-transcribe --onnx decodes this "
            "TDT export"
        )
    if installed is None or _release(installed) >= _release(SHERPA_TDT_VERSION):
        return None
    return (
        f"sherpa-onnx {installed} is too old to read durations: this TDT export needs "
        f"sherpa-onnx {SHERPA_TDT_VERSION} or newer (pip install 'sherpa-onnx>="
        f"{SHERPA_TDT_VERSION}'); asr-transcribe --onnx decodes it"
    )
