"""Decode a cut manifest: every cut's hypothesis and word errors in `hyps.jsonl`, the
corpus totals in `wer.json` (what `asr-decode` runs).

An utterance whose audio cannot be read is never left out of the WER: it counts as all
deletions (an empty hypothesis, marked `"unreadable"` in hyps.jsonl). Errors that are not
about one file (a wrong sample rate, a bug) stop the run.

`encode_manifest` runs the same reading and the encoder once and keeps the encoder's output,
for searches with many settings over the same utterances (`asr-sweep`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from lhotse import CutSet
from lhotse.cut import Cut
from rich.progress import Progress

from asr.data.buckets import build_eval_sampler
from asr.data.corpus import cut_text, load_cuts
from asr.data.dataset import FILE_ERRORS
from asr.data.features import check_sample_rate
from asr.decoding.biasing import BiasingGraph
from asr.decoding.fusion import LmFusion
from asr.errors import first_line
from asr.inference.recognizer import Recognizer
from asr.metrics import ErrorCounts, word_errors

log = logging.getLogger(__name__)


# One hyps.jsonl line before it is scored: the cut, its hypothesis, and why its audio could
# not be read (None when it could).
_Line = tuple[Cut, str, str | None]


def _read_batch(
    recognizer: Recognizer, batch: CutSet
) -> tuple[list[torch.Tensor], list[Cut], list[_Line]]:
    """(features, cuts) of the cuts of `batch` whose audio reads, and a line with an empty
    hypothesis for each of the others."""
    feats: list[torch.Tensor] = []
    kept: list[Cut] = []
    unreadable: list[_Line] = []
    for cut in batch:
        check_sample_rate(cut.id, cut.sampling_rate)
        try:
            audio = cut.load_audio()
        except FILE_ERRORS as err:
            log.warning(
                "%s: unreadable audio, counted as all deletions (%s)", cut.id, first_line(err)
            )
            unreadable.append((cut, "", first_line(err)))
            continue
        feats.append(recognizer.features_of(audio))
        kept.append(cut)
    return feats, kept, unreadable


def _batches(
    recognizer: Recognizer, manifest: str | Path, max_duration: float
) -> Iterator[tuple[list[torch.Tensor], list[Cut], list[_Line]]]:
    """`_read_batch` of each batch of the manifest's cuts (`max_duration` seconds each)."""
    for batch in build_eval_sampler(load_cuts(manifest), max_duration):
        yield _read_batch(recognizer, batch)


@dataclass(frozen=True)
class EncodedBatch:
    """The encoder's output (B, T, D) and lengths (B,) of a batch's readable cuts."""

    cuts: list[Cut]
    encoder_out: torch.Tensor
    encoder_lens: torch.Tensor


@dataclass(frozen=True)
class EncodedManifest:
    """A manifest's cuts encoded once (`encode_manifest`): the batches of readable cuts,
    and the cuts whose audio could not be read with why (they count as all deletions)."""

    batches: list[EncodedBatch]
    unreadable: list[tuple[Cut, str]]

    @property
    def cuts(self) -> list[Cut]:
        """Every cut, the readable ones first."""
        return [c for b in self.batches for c in b.cuts] + [c for c, _ in self.unreadable]

    @property
    def references(self) -> list[str]:
        """Every cut's transcript, in `cuts`' order."""
        return [cut_text(cut) for cut in self.cuts]


@torch.inference_mode()
def encode_manifest(
    recognizer: Recognizer, manifest: str | Path, max_duration: float = 200.0
) -> EncodedManifest:
    """Every cut of `manifest` read (as `decode_manifest` reads them) and encoded, in
    batches of `max_duration` seconds; the encoder's output stays on the recognizer's
    device."""
    batches: list[EncodedBatch] = []
    unreadable: list[tuple[Cut, str]] = []
    with Progress(transient=True) as progress:
        task = progress.add_task(f"Encoding {Path(manifest).name}", total=None)
        for feats, kept, lines in _batches(recognizer, manifest, max_duration):
            unreadable += [(cut, why) for cut, _, why in lines]
            if kept:
                batches.append(EncodedBatch(kept, *recognizer._encode(feats)))
            progress.update(task, advance=len(kept) + len(lines))
    return EncodedManifest(batches, unreadable)


def _recognize(
    recognizer: Recognizer,
    feats: list[torch.Tensor],
    kept: list[Cut],
    nbest: int,
    biasing: BiasingGraph | None,
    lm: LmFusion | None = None,
) -> tuple[list[str], dict[str, list[tuple[str, float]]]]:
    """The best hypothesis of each kept cut and, with `nbest` > 1, its n best by cut id."""
    if nbest > 1:
        lists = recognizer.nbest_features(feats, nbest, biasing, lm) if kept else []
        hyps = [h[0][0] if h else "" for h in lists]
    else:
        lists, hyps = [], recognizer.transcribe_features(feats, biasing, lm) if kept else []
    return hyps, dict(zip([cut.id for cut in kept], lists, strict=False))


def _hyp_line(
    line: _Line, ref: str, errors: ErrorCounts, alternatives: dict[str, list[tuple[str, float]]]
) -> dict:
    """One line of hyps.jsonl."""
    cut, hyp, unreadable = line
    out = {"id": cut.id, "ref": ref, "hyp": hyp, **errors.__dict__}
    if unreadable:
        out["unreadable"] = unreadable
    if cut.id in alternatives:
        out["nbest"] = [
            {"hyp": text, "score": round(score, 4)} for text, score in alternatives[cut.id]
        ]
    return out


def decode_manifest(
    recognizer: Recognizer,
    manifest: str | Path,
    output_dir: str | Path,
    max_duration: float = 200.0,
    nbest: int = 1,
    biasing: BiasingGraph | None = None,
    lm: LmFusion | None = None,
    settings: dict | None = None,
) -> dict:
    """Decode every cut of `manifest`; write hyps.jsonl and wer.json; return the totals.
    With `nbest` > 1 each line of hyps.jsonl also lists the n best hypotheses and their
    scores (`nbest`: [{"hyp", "score"}, ...], best first; `hyp` is the first). `biasing`:
    phrases to boost (`asr.decoding.biasing`); `lm`: a language model to fuse
    (`asr.decoding.fusion`); `settings`: what the totals were decoded with (the search,
    the phrases, the LM), written into wer.json with them."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    total, skipped, utterances, audio_seconds = ErrorCounts(), 0, 0, 0.0
    start = time.perf_counter()
    with open(output_dir / "hyps.jsonl", "w") as out, Progress(transient=True) as progress:
        task = progress.add_task(f"Decoding {Path(manifest).name}", total=None)
        for feats, kept, lines in _batches(recognizer, manifest, max_duration):
            skipped += len(lines)
            hyps, alternatives = _recognize(recognizer, feats, kept, nbest, biasing, lm)
            lines += [(cut, hyp, None) for cut, hyp in zip(kept, hyps, strict=True)]
            for line in lines:
                cut, hyp, unreadable = line
                ref = cut_text(cut)
                errors = word_errors(ref, hyp)
                total = total + errors
                utterances += 1
                audio_seconds += 0.0 if unreadable else cut.duration
                out.write(json.dumps(_hyp_line(line, ref, errors, alternatives)) + "\n")
            progress.update(
                task, advance=len(lines), description=f"Decoding: WER {100 * total.wer:.2f}%"
            )
    elapsed = time.perf_counter() - start
    summary = {
        "manifest": str(manifest),
        "wer": round(100 * total.wer, 3),
        **total.__dict__,
        "utterances": utterances,
        "utterances_skipped": skipped,  # unreadable: counted as all deletions
        "audio_seconds": round(audio_seconds, 1),
        "decode_seconds": round(elapsed, 2),
        "rtfx": round(audio_seconds / elapsed, 1) if elapsed > 0 else None,
        **(settings or {}),
    }
    (output_dir / "wer.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
