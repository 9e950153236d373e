"""LibriSpeech (or anything in its directory layout) -> lhotse manifests.

`prepare_manifests` reads `<corpus>/<part>/<spk>/<chapter>/*.trans.txt` with lhotse's
LibriSpeech utterance parser and writes, per part, into the output directory:
`librispeech_recordings_<part>.jsonl.gz`, `librispeech_supervisions_<part>.jsonl.gz` and
`librispeech_cuts_<part>.jsonl.gz`. Word times in `*.alignment.txt` files beside the
transcripts (the LibriSpeech alignments' format, which the demo corpus writes) become the
supervisions' `alignment["word"]`. Unlike lhotse's `prepare_librispeech`, an unreadable
audio file or an empty transcript line is skipped with a warning and counted instead of
aborting the whole preparation.

On a machine with internet access `download_librispeech` fetches the real corpus
(through lhotse) into the same layout, so the recipe is the same for both, and
`download_librispeech_lm_text` its language-model text (`--lm-text FILE`).

It also owns how the rest of the package reads manifests: `load_cuts` (one, lazily),
`open_cuts` (several, interleaved) and `cut_text` (a cut's transcript).

Run as `asr-prepare-manifests --corpus-dir DIR --output-dir data/manifests [--download]`.
"""

from __future__ import annotations

import argparse
import gzip
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lhotse import CutSet, Recording, RecordingSet, SupervisionSet, load_manifest_lazy
from lhotse.cut import Cut
from lhotse.qa import fix_manifests, validate_recordings_and_supervisions
from lhotse.recipes.librispeech import LIBRISPEECH, parse_alignments, parse_utterance
from lhotse.supervision import AlignmentItem
from rich.progress import track

from asr.cli import command
from asr.errors import first_line

log = logging.getLogger(__name__)

DEMO_PARTS = ("train-clean-100", "dev-clean", "test-clean")
UNLABELLED = "train-unlabelled"  # the demo's audio without transcripts (asr.demo.plan)
PREFIX = "librispeech"
OPENSLR_URL = "http://www.openslr.org/resources"  # lhotse's download_librispeech's base_url
LIBRISPEECH_LM_TEXT = "librispeech-lm-norm.txt.gz"  # openslr.org/11


@dataclass
class PreparationReport:
    """What `prepare_manifests` did for one part."""

    part: str
    utterances: int = 0
    hours: float = 0.0
    skipped: list[str] = field(default_factory=list)


def cuts_path(manifest_dir: str | Path, part: str) -> Path:
    """Where the CutSet of `part` lives inside `manifest_dir`."""
    return Path(manifest_dir) / f"{PREFIX}_cuts_{part}.jsonl.gz"


@dataclass(frozen=True)
class CorpusDir:
    """A `data_dir` as the configs expect it: `LibriSpeech/` (the audio and `*.trans.txt`
    files), `manifests/` and `tokenizer/bpe<vocab_size>.model`."""

    root: Path
    vocab_size: int

    @property
    def librispeech(self) -> Path:
        return self.root / "LibriSpeech"

    @property
    def manifests(self) -> Path:
        return self.root / "manifests"

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer" / f"bpe{self.vocab_size}.model"

    def cuts(self, part: str) -> Path:
        return cuts_path(self.manifests, part)

    def transcripts(self, part: str) -> dict[str, str]:
        """Utterance id -> transcript, read from the part's `*.trans.txt` files."""
        lines = {}
        for path in sorted((self.librispeech / part).rglob("*.trans.txt")):
            for line in path.read_text().splitlines():
                utt_id, _, text = line.partition(" ")
                lines[utt_id] = text
        return lines


def load_cuts(path: str | Path) -> CutSet:
    """Open a CutSet manifest lazily, with an error naming the stage that makes it."""
    path = Path(path)
    if not path.is_file():
        if "-feats" in path.name:
            stage, command = "features", "asr-compute-features --cuts ... --output ..."
        else:
            stage, command = "manifests", "asr-prepare-manifests --corpus-dir ... --output-dir ..."
        raise FileNotFoundError(
            f"manifest not found: {path} (it is made by the '{stage}' stage: {command}, "
            f"or recipes/*/run.sh --stage {stage})"
        )
    return load_manifest_lazy(path)


def open_cuts(paths: Sequence[str | Path], seed: int = 0) -> CutSet:
    """Open one or more cut manifests lazily; several are interleaved at random in
    proportion to their sizes (e.g. LibriSpeech's three training parts)."""
    paths = [Path(p) for p in paths]
    sets = [load_cuts(p) for p in paths]
    if len(sets) == 1:
        return sets[0]
    weights = [_count_lines(p) for p in paths]
    return CutSet.mux(*sets, weights=weights, seed=seed)


def _count_lines(path: Path) -> int:
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
        return sum(1 for _ in f)


def cut_text(cut: Cut) -> str:
    """The transcript of a cut: its supervisions' texts, stripped, joined by spaces."""
    return " ".join(s.text.strip() for s in cut.supervisions if s.text).strip()


def librispeech_parts(parts: Sequence[str] | str = "librispeech") -> list[str]:
    """Part names, with the groups `librispeech` (the 960 h and dev/test) and
    `mini_librispeech` (train-clean-5, dev-clean-2) expanded; an unknown name is an error
    (lhotse would only log it and download nothing)."""
    from lhotse.recipes.librispeech import LIBRISPEECH, MINI_LIBRISPEECH

    groups = {"librispeech": LIBRISPEECH, "mini_librispeech": MINI_LIBRISPEECH}
    names = [parts] if isinstance(parts, str) else list(parts)
    expanded = [part for name in names for part in groups.get(name, (name,))]
    unknown = [part for part in expanded if part not in (*LIBRISPEECH, *MINI_LIBRISPEECH)]
    if unknown:
        raise ValueError(
            f"unknown LibriSpeech part(s) {unknown}; valid: librispeech, mini_librispeech, "
            f"{', '.join((*LIBRISPEECH, *MINI_LIBRISPEECH))}"
        )
    return list(dict.fromkeys(expanded))


def download_librispeech(
    target_dir: str | Path, parts: Sequence[str] | str = "librispeech"
) -> Path:
    """Download and extract LibriSpeech parts (`librispeech_parts` names) into
    `target_dir/LibriSpeech` (needs internet)."""
    from lhotse.recipes import download_librispeech as lhotse_download

    return lhotse_download(target_dir, dataset_parts=librispeech_parts(parts))


def download_librispeech_lm_text(path: str | Path, base_url: str = OPENSLR_URL) -> Path:
    """The LibriSpeech LM text (openslr.org/11 `librispeech-lm-norm.txt.gz`, 1.4 GB: 40 M
    normalized sentences, 800 M words, of 14,500 public-domain books, the books of the dev
    and test sets left out) downloaded to `path`, unless a file is there. Fetched with
    lhotse's resumable download, as `download_librispeech` fetches the corpus, into
    `path.part` (an interrupted download resumes there), renamed to `path` when complete: a
    file at `path` is whole."""
    path = Path(path)
    if path.is_file():
        log.info("%s exists: not downloaded", path)
        return path
    from lhotse.utils import resumable_download

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    resumable_download(f"{base_url}/11/{LIBRISPEECH_LM_TEXT}", filename=partial)
    partial.replace(path)
    return path


def _newest_text(part_dir: Path) -> float:
    """The modification time of the part's newest transcript or alignment file."""
    files = [*part_dir.rglob("*.trans.txt"), *part_dir.rglob("*.alignment.txt")]
    return max((path.stat().st_mtime for path in files), default=0.0)


def _read_alignments(part_dir: Path) -> dict[str, list[AlignmentItem]]:
    """Word alignments by utterance id from the part's `*.alignment.txt` files (the
    LibriSpeech alignments' format; the demo corpus writes them), if any. A file that
    cannot be parsed is named in a warning and left out."""
    found: dict[str, list[AlignmentItem]] = {}
    for path in sorted(part_dir.rglob("*.alignment.txt")):
        try:
            found.update(parse_alignments(path))
        except ValueError as err:
            log.warning("%s: not a word alignment file, ignored (%s)", path, err)
    return found


def _parse_part(part_dir: Path) -> tuple[RecordingSet, SupervisionSet, list[str]]:
    recordings, supervisions, skipped = [], [], []
    lines = [
        (trans, line)
        for trans in sorted(part_dir.rglob("*.trans.txt"))
        for line in trans.read_text().splitlines()
        if line.strip()
    ]
    alignments = _read_alignments(part_dir)
    for trans, line in track(lines, description=f"Reading {part_dir.name}"):
        utt_id, _, text = line.strip().partition(" ")
        if not text.strip():
            skipped.append(f"{utt_id}: empty transcript in {trans}")
            continue
        try:
            parsed = parse_utterance(part_dir, line, alignments)
        except Exception as err:  # a corrupt or unreadable audio file: skip, keep going
            skipped.append(f"{utt_id}: unreadable audio ({type(err).__name__}: {err})")
            continue
        if parsed is None:
            skipped.append(f"{utt_id}: audio file missing")
            continue
        recordings.append(parsed[0])
        supervisions.append(parsed[1])
    return (
        RecordingSet.from_recordings(recordings),
        SupervisionSet.from_segments(supervisions),
        skipped,
    )


def prepare_manifests(
    corpus_dir: str | Path,
    output_dir: str | Path,
    parts: list[str] | None = None,
) -> dict[str, PreparationReport]:
    """Write recordings, supervisions and cuts manifests for each part found in `corpus_dir`.

    `corpus_dir` is the `LibriSpeech` directory holding part directories. `parts` defaults
    to every standard LibriSpeech part present, and the demo's train-unlabelled when present
    (`prepare_unlabelled`). Parts whose cuts manifest already exists are
    left alone (delete it to redo) unless a transcript or alignment file of the part is
    newer (a rebuilt corpus). Returns one report per part.
    """
    corpus_dir, output_dir = Path(corpus_dir), Path(output_dir)
    if not corpus_dir.is_dir():
        raise FileNotFoundError(
            f"corpus directory not found: {corpus_dir} (make it with asr-make-demo-corpus "
            "or download LibriSpeech with --download)"
        )
    unlabelled = parts is None or UNLABELLED in parts
    parts = [p for p in parts if p != UNLABELLED] if parts is not None else None
    if parts is None:
        parts = [p for p in LIBRISPEECH if (corpus_dir / p).is_dir()]
        if not parts:
            raise FileNotFoundError(
                f"no LibriSpeech part directory (e.g. {', '.join(DEMO_PARTS)}) in {corpus_dir}"
            )
    output_dir.mkdir(parents=True, exist_ok=True)
    reports = {}
    for part in parts:
        part_dir = corpus_dir / part
        if not part_dir.is_dir():
            raise FileNotFoundError(f"part directory not found: {part_dir}")
        report = PreparationReport(part)
        out = cuts_path(output_dir, part)
        if out.is_file() and _newest_text(part_dir) > out.stat().st_mtime:
            log.warning("%s is older than the transcripts of %s: preparing it again", out, part)
        elif out.is_file():
            log.info("%s exists: skipping %s", out, part)
            cuts = load_manifest_lazy(out)
            report.utterances = sum(1 for _ in cuts)
            report.hours = sum(c.duration for c in cuts) / 3600
            reports[part] = report
            continue
        recordings, supervisions, report.skipped = _parse_part(part_dir)
        for reason in report.skipped:
            log.warning("skipped %s", reason)
        if len(recordings) == 0:
            raise ValueError(f"no usable utterance in {part_dir}")
        recordings, supervisions = fix_manifests(recordings, supervisions)
        validate_recordings_and_supervisions(recordings, supervisions)
        recordings.to_file(output_dir / f"{PREFIX}_recordings_{part}.jsonl.gz")
        supervisions.to_file(output_dir / f"{PREFIX}_supervisions_{part}.jsonl.gz")
        # One supervision per recording: each cut takes the utterance id (lhotse numbers them).
        cuts = CutSet.from_manifests(recordings=recordings, supervisions=supervisions)
        cuts = CutSet([cut.with_id(cut.recording_id) for cut in cuts])
        tmp = out.with_name(out.name + ".tmp.jsonl.gz")
        cuts.to_file(tmp)
        tmp.replace(out)
        report.utterances = len(cuts)
        report.hours = sum(c.duration for c in cuts) / 3600
        reports[part] = report
    if unlabelled and (corpus_dir / UNLABELLED).is_dir():
        reports[UNLABELLED] = prepare_unlabelled(corpus_dir / UNLABELLED, output_dir)
    return reports


def prepare_unlabelled(part_dir: str | Path, output_dir: str | Path) -> PreparationReport:
    """The cuts manifest of a part of audio alone (the demo's train-unlabelled: no
    transcripts, for self-supervised pre-training): one cut per audio file, without
    supervisions, the cut named after its file. An unreadable file is skipped and named."""
    part_dir, output_dir = Path(part_dir), Path(output_dir)
    report = PreparationReport(part_dir.name)
    out = cuts_path(output_dir, part_dir.name)
    files = sorted(part_dir.rglob("*.flac"))
    if out.is_file() and all(f.stat().st_mtime <= out.stat().st_mtime for f in files):
        cuts = load_manifest_lazy(out)
        report.utterances = sum(1 for _ in cuts)
        report.hours = sum(c.duration for c in cuts) / 3600
        return report
    recordings = []
    for path in files:
        try:
            recordings.append(Recording.from_file(path))
        except Exception as err:  # noqa: BLE001 - any unreadable file is skipped, named
            report.skipped.append(f"{path}: {first_line(err)}")
            log.warning("skipped %s", report.skipped[-1])
    if not recordings:
        raise ValueError(f"no readable audio file in {part_dir}")
    cuts = CutSet.from_manifests(recordings=RecordingSet.from_recordings(recordings))
    cuts = CutSet([cut.with_id(cut.recording_id) for cut in cuts])
    output_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp.jsonl.gz")
    cuts.to_file(tmp)
    tmp.replace(out)
    report.utterances = len(cuts)
    report.hours = sum(c.duration for c in cuts) / 3600
    return report


@command
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus-dir", type=Path, help="the LibriSpeech directory")
    parser.add_argument("--output-dir", type=Path, default=Path("data/manifests"))
    parser.add_argument(
        "--parts",
        nargs="*",
        default=None,
        help="parts to prepare (default: every part present); to download: part names or the "
        "groups librispeech (default) and mini_librispeech",
    )
    parser.add_argument(
        "--download",
        action="store_true",
        help="first download LibriSpeech (all 960 h + dev/test) into the parent of --corpus-dir",
    )
    parser.add_argument("--download-only", action="store_true", help="download, make no manifest")
    parser.add_argument(
        "--lm-text",
        type=Path,
        metavar="FILE",
        help=f"download the LibriSpeech LM text (openslr.org/11 {LIBRISPEECH_LM_TEXT}, 1.4 GB) "
        "to FILE unless it is there; alone (no --corpus-dir), nothing else",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.lm_text is not None:
        print(f"LM text: {download_librispeech_lm_text(args.lm_text)}")
        if args.corpus_dir is None:
            return
    if args.corpus_dir is None:
        parser.error("the following arguments are required: --corpus-dir (or --lm-text)")
    if args.download or args.download_only:
        download_librispeech(args.corpus_dir.parent, args.parts or "librispeech")
    if args.download_only:
        return
    parts = librispeech_parts(args.parts) if args.download and args.parts else args.parts
    for part, report in prepare_manifests(args.corpus_dir, args.output_dir, parts).items():
        print(
            f"{part}: {report.utterances} utterances, {report.hours:.2f} h, "
            f"{len(report.skipped)} skipped"
        )


if __name__ == "__main__":
    main()
