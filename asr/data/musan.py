"""MUSAN (music, speech and noise, openslr.org/17) -> a lhotse cut manifest of noise for
training with on-the-fly noise (`data.augment.noise.cuts`, asr/data/augment.py), as
icefall's LibriSpeech recipe prepares it (`lhotse prepare musan`: music, speech and noise;
cuts of 5 s or less dropped), but keeping the audio: the augmentation mixes it into the
training audio as cuts are loaded, so no features are computed.

One cut per MUSAN file, tagged `custom["noise_type"]` with its part. icefall splits files
into 10 s windows because it stores their features; here a long file stays whole and the
augmentation cuts it at a random offset. MUSAN is 16 kHz throughout and nothing is
resampled: a file at another rate stops the preparation, named. Unlike lhotse's
`prepare_musan`, which aborts on the first unreadable file, an unreadable file is skipped
with a warning and counted. The manifest is written under a temporary name and renamed, so
a stopped run leaves no half-written manifest.

    asr-prepare-musan --corpus-dir data/librispeech/musan --download \\
        -o data/librispeech/manifests/musan_cuts.jsonl.gz

(`--download` fetches the 11 GB archive with lhotse's `download_musan` into the parent of
`--corpus-dir`, which must then be named `musan`; recipes/librispeech/run.sh runs this with
`MUSAN=1`.)
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lhotse import CutSet, Recording, RecordingSet
from lhotse.recipes import musan as lhotse_musan
from rich.progress import track

from asr.cli import command
from asr.errors import first_line
from asr.frames import SAMPLE_RATE

log = logging.getLogger(__name__)

PARTS = ("music", "speech", "noise")
DEFAULT_PARTS = PARTS  # as icefall and lhotse's prepare_musan (prepare_musan_cuts says why)
MIN_SECONDS = 5.0  # icefall drops MUSAN cuts of 5 s or less


def _check_parts(parts: Sequence[str]) -> list[str]:
    if isinstance(parts, str):
        parts = [parts]
    unknown = [part for part in parts if part not in PARTS]
    if unknown:
        raise ValueError(f"unknown MUSAN part(s) {', '.join(unknown)}; valid: {', '.join(PARTS)}")
    if not parts:
        raise ValueError(f"no MUSAN part given; valid: {', '.join(PARTS)}")
    return list(dict.fromkeys(parts))


def _holds_musan(corpus_dir: Path, parts: Sequence[str]) -> bool:
    return all((corpus_dir / part).is_dir() for part in parts)


def _read_part(part_dir: Path, part: str) -> tuple[list[Recording], list[str]]:
    """The recordings of `part_dir`'s WAV files (headers only) and the files skipped as
    unreadable (`path: reason`). A file not at 16 kHz raises ValueError naming it."""
    recordings, skipped = [], []
    files = sorted(part_dir.rglob("*.wav"))
    for path in track(files, description=f"Reading MUSAN {part}"):
        try:
            recording = Recording.from_file(path)
        except Exception as err:  # noqa: BLE001 - the decoders raise many kinds: skip any
            skipped.append(f"{path}: {first_line(err)}")
            log.warning("skipped %s", skipped[-1])
            continue
        if recording.sampling_rate != SAMPLE_RATE:
            raise ValueError(
                f"{path}: {recording.sampling_rate} Hz, not the {SAMPLE_RATE} Hz of MUSAN "
                "(nothing is resampled here)"
            )
        recordings.append(recording)
    return recordings, skipped


def prepare_musan_cuts(
    corpus_dir: str | Path,
    output: str | Path,
    *,
    parts: Sequence[str] = DEFAULT_PARTS,
    min_seconds: float = MIN_SECONDS,
    download_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Write `output` (a `.jsonl.gz` cut manifest): one cut per WAV file of each of MUSAN's
    `parts` under `corpus_dir` (`<part>/<source>/*.wav`, as lhotse's `prepare_musan` reads
    it), tagged `custom["noise_type"] = part`, those shorter than `min_seconds` left out.

    `parts` defaults to all three, as icefall's LibriSpeech recipe mixes them
    (local/compute_fbank_musan.py), because MUSAN's read speech 10-20 dB below the utterance
    is a competing talker the transcript never holds, which the model learns to ignore;
    `("music", "noise")` leaves the talkers out.

    When `corpus_dir` lacks a part's directory and `download_dir` is given, MUSAN is first
    downloaded and extracted there with lhotse (`download_dir/musan`, 11 GB; skipped when
    lhotse's `.musan_completed` marker is there) and read from where it lands.

    Returns a summary: `{"output", "corpus_dir", "parts": {part: {"cuts", "hours",
    "dropped_short", "skipped"}}, "skipped": ["path: reason", ...]}` (the per-part
    "skipped" a count of unreadable files).
    """
    parts = _check_parts(parts)
    if min_seconds < 0:
        raise ValueError(f"min_seconds must be >= 0, got {min_seconds}")
    output = Path(output)
    if not output.name.endswith((".jsonl.gz", ".jsonl")):
        raise ValueError(f"{output}: a cut manifest is written as .jsonl.gz (or .jsonl)")
    corpus_dir = Path(corpus_dir)
    if not _holds_musan(corpus_dir, parts) and download_dir is not None:
        corpus_dir = Path(lhotse_musan.download_musan(download_dir))
    if not _holds_musan(corpus_dir, parts):
        missing = [part for part in parts if not (corpus_dir / part).is_dir()]
        raise FileNotFoundError(
            f"no MUSAN in {corpus_dir} (no {', '.join(missing)} directory): download it with "
            "--download (11 GB from openslr.org/17), or give the directory musan.tar.gz "
            "extracts to"
        )
    cuts = []
    summary: dict[str, Any] = {
        "output": str(output), "corpus_dir": str(corpus_dir), "parts": {}, "skipped": []
    }  # fmt: skip
    for part in parts:
        recordings, skipped = _read_part(corpus_dir / part, part)
        summary["skipped"] += skipped
        kept = [r for r in recordings if r.duration >= min_seconds]
        if kept:
            part_cuts = CutSet.from_manifests(recordings=RecordingSet.from_recordings(kept))
            for cut in part_cuts:
                cut = cut.with_id(cut.recording_id)
                cut.custom = {"noise_type": part}
                cuts.append(cut)
        summary["parts"][part] = {
            "cuts": len(kept),
            "hours": sum(r.duration for r in kept) / 3600,
            "dropped_short": len(recordings) - len(kept),
            "skipped": len(skipped),
        }
    if not cuts:
        raise ValueError(
            f"no MUSAN file of {min_seconds:g} s or more in {corpus_dir} (parts {', '.join(parts)})"
        )
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name.replace(".jsonl", ".tmp.jsonl"))
    CutSet.from_cuts(cuts).to_file(tmp)
    tmp.replace(output)
    return summary


@command
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--corpus-dir", type=Path, required=True, help="the musan directory (music/, noise/, ...)"
    )
    parser.add_argument(
        "-o", "--output", type=Path, default=Path("data/manifests/musan_cuts.jsonl.gz")
    )
    parser.add_argument(
        "--download",
        action="store_true",
        help="first download MUSAN (11 GB) into the parent of --corpus-dir, unless it is there",
    )
    parser.add_argument(
        "--parts",
        nargs="+",
        default=list(DEFAULT_PARTS),
        help=f"MUSAN parts to use (default: {' '.join(DEFAULT_PARTS)}, as icefall)",
    )
    parser.add_argument(
        "--min-seconds", type=float, default=MIN_SECONDS, help="leave out shorter files"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    download_dir = None
    if args.download:
        if args.corpus_dir.name != "musan":
            raise ValueError(
                f"--download extracts MUSAN to {args.corpus_dir.parent / 'musan'}: give that "
                f"as --corpus-dir, not {args.corpus_dir}"
            )
        download_dir = args.corpus_dir.parent
    summary = prepare_musan_cuts(
        args.corpus_dir,
        args.output,
        parts=args.parts,
        min_seconds=args.min_seconds,
        download_dir=download_dir,
    )
    for part, counts in summary["parts"].items():
        print(
            f"{part}: {counts['cuts']} cuts, {counts['hours']:.2f} h "
            f"({counts['dropped_short']} shorter than {args.min_seconds:g} s left out)"
        )
    print(f"wrote {args.output}; {len(summary['skipped'])} unreadable file(s) skipped")


if __name__ == "__main__":
    main()
