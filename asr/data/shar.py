"""lhotse Shar shards: a cut manifest written as numbered shards for sequential reads
(`asr-export-shar`), and the list of a shard directory's files, local or by URL.

    asr-export-shar data/demo/manifests/librispeech_cuts_train-clean-100.jsonl.gz \\
        -o data/demo/shar/train-clean-100 --shard-size 1000 --fields recording

A Shar directory holds, per shard N, `cuts.N.jsonl.gz` (the cut manifest) beside one tar
per field (`recording.N.tar`: audio; `features.N.tar`: stored features), with the same cuts
in the same order; lhotse's `SharWriter` writes them and `CutSet.from_shar` reads them. The
export adds `shar_index.json`: the shard files of each field in order and the counts, so
that a directory served over HTTP, which cannot be listed, can be read.

Each cut's data is loaded (decoded) before anything of it is written: a cut whose file is
unreadable (missing, truncated, corrupt: `asr.data.dataset.FILE_ERRORS`) is skipped with a
warning naming it and never written, so the cut lists and the tars stay aligned. Anything
else (a cut without the field, a disk full, a bug) stops the export; a directory without
its index is an export that did not finish.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import operator
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from lhotse import fastcopy
from lhotse.cut import Cut
from lhotse.cut.data import DataCut
from lhotse.shar import SharWriter
from lhotse.shar.utils import to_shar_placeholder
from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress

from asr.cli import command
from asr.data.corpus import load_cuts
from asr.data.dataset import FEATURE_FILE_ERRORS, FILE_ERRORS
from asr.errors import first_line

log = logging.getLogger(__name__)

INDEX = "shar_index.json"
FIELDS = ("recording", "features")
AUDIO_FORMATS = ("flac", "original")
# Codecs lhotse's audio tar writer encodes (`audio_format="original"` keeps these only).
WRITABLE_CODECS = ("flac", "wav", "mp3", "opus")
# Stored features are lilcom-compressed already (asr-compute-features, at this step, 2^-5):
# compressed again they stay within half a step (2^-6) of the stored values, at a quarter of
# the size of float32 arrays.
FEATURES_COMPRESSION = "lilcom"
NAMED_SKIPS = 5  # unreadable cuts named in the closing summary
# lhotse's shard names: <field>.<number>.<extension>, e.g. recording.000012.tar
_SHARD_NAME = re.compile(r"^(?P<field>[A-Za-z_][\w-]*)\.(?P<number>\d+)\.(?:jsonl\.gz|tar)$")


@dataclass(frozen=True)
class SharExport:
    """What `export_shar` wrote: the shard files of each field ("cuts" first) in order,
    relative to `output_dir`, `shard_size` cuts each (the last the rest), the cuts written
    and the unreadable ones skipped (the first `NAMED_SKIPS` by id), and the audio seconds
    written."""

    output_dir: Path
    fields: dict[str, list[str]]
    shard_size: int
    cuts: int
    skipped: int
    skipped_ids: tuple[str, ...]
    duration: float

    @property
    def shards(self) -> int:
        return len(self.fields["cuts"])

    def index(self) -> dict:
        """The content of `shar_index.json`."""
        return {
            "fields": self.fields,
            "cuts_written": self.cuts,
            "cuts_skipped": self.skipped,
            "shards": self.shards,
            "shard_size": self.shard_size,
            "duration_seconds": round(self.duration, 3),
        }


def export_shar(
    cuts: Iterable[Cut],
    output_dir: str | Path,
    *,
    fields: Sequence[str] = ("recording",),
    shard_size: int = 1000,
    audio_format: str = "flac",
) -> SharExport:
    """Write `cuts` as Shar shards of `shard_size` cuts into `output_dir` (new or empty of
    shards), with each of `fields` (`recording`: audio as FLAC, or in each input file's own
    codec with `audio_format="original"`; `features`: the stored features), then
    `shar_index.json`. Unreadable cuts are skipped (see the module docstring). With
    `features` alone a cut keeps its reference to its input audio, unless it starts inside
    its recording (its start becomes the start of its features)."""
    fields = (fields,) if isinstance(fields, str) else tuple(fields)
    _check_options(fields, shard_size, audio_format)
    output_dir = Path(output_dir)
    _check_no_shards(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    formats = {"recording": audio_format, "features": FEATURES_COMPRESSION}
    written, skipped, duration = 0, 0, 0.0
    skipped_ids: list[str] = []
    writer = SharWriter(
        output_dir, fields={f: formats[f] for f in fields}, shard_size=shard_size,
        warn_unused_fields=False,
    )  # fmt: skip
    columns = (*Progress.get_default_columns(), MofNCompleteColumn())
    # on stderr: stdout is the command's result line
    progress = Progress(*columns, console=Console(stderr=True), transient=True)
    with writer, progress:
        task = progress.add_task(f"Writing Shar shards to {output_dir}", total=_length(cuts))
        for cut in cuts:
            progress.advance(task)
            codec = _check_cut(cut, fields, audio_format)
            try:
                data = _load(cut, fields)
            except _Unreadable as err:
                log.warning("%s: %s, skipped", cut.id, err)
                skipped += 1
                if len(skipped_ids) < NAMED_SKIPS:
                    skipped_ids.append(cut.id)
                continue
            _write(writer, cut, data, codec)
            written += 1
            duration += cut.duration
    if skipped:
        more = ", ..." if skipped > len(skipped_ids) else ""
        log.warning(
            "skipped %d unreadable cut(s), not written: %s%s", skipped, ", ".join(skipped_ids), more
        )
    if not written:
        raise ValueError(
            f"no cut written to {output_dir}: "
            + (f"all {skipped} were unreadable" if skipped else "the input has no cuts")
        )
    names = {field: [Path(p).name for p in paths] for field, paths in writer.output_paths.items()}
    export = SharExport(
        output_dir, names, shard_size, written, skipped, tuple(skipped_ids), duration
    )
    tmp = output_dir / f"{INDEX}.tmp"  # whole or absent: the index marks a finished export
    tmp.write_text(json.dumps(export.index(), indent=1) + "\n")
    tmp.replace(output_dir / INDEX)
    return export


def _check_options(fields: tuple[str, ...], shard_size: int, audio_format: str) -> None:
    if not fields or any(f not in FIELDS for f in fields) or len(set(fields)) < len(fields):
        raise ValueError(f"fields must be one or both of {', '.join(FIELDS)}, got {list(fields)}")
    if shard_size < 1:
        raise ValueError(f"shard size must be at least 1 cut, got {shard_size}")
    if audio_format not in AUDIO_FORMATS:
        raise ValueError(
            f"audio format must be one of {', '.join(AUDIO_FORMATS)}, got {audio_format}"
        )


def _check_no_shards(output_dir: Path) -> None:
    """Refuse a directory that holds shards already: lhotse would overwrite some of them and
    leave the others, and a reader that globs would mix two exports."""
    if not output_dir.is_dir():
        return
    found = sorted(
        p.name for p in output_dir.iterdir() if p.name == INDEX or _SHARD_NAME.match(p.name)
    )
    if found:
        raise FileExistsError(
            f"{output_dir} already holds Shar shards ({found[0]}): remove them or write to "
            "another directory"
        )


def _length(cuts: Iterable[Cut]) -> int | None:
    """The number of cuts when known without reading them (a lazily opened manifest counts
    its lines), for the progress bar."""
    try:
        return len(cuts)  # type: ignore[arg-type]
    except (TypeError, NotImplementedError, AttributeError):
        return None


class _Unreadable(Exception):
    """A cut whose file cannot be read: skipped, never written (the message says why)."""


def _check_cut(cut: Cut, fields: tuple[str, ...], audio_format: str) -> str | None:
    """Raise when `cut` cannot be exported as asked (a set-up error, not a bad file); the
    codec to write its audio in."""
    if not isinstance(cut, DataCut):
        raise ValueError(
            f"cut {cut.id} is a {type(cut).__name__}: Shar export writes cuts of one "
            "recording (MonoCut or MultiCut)"
        )
    if "features" in fields and not cut.has_features:
        raise ValueError(
            f"cut {cut.id} has no stored features: compute them first "
            "(asr-compute-features), or export --fields recording"
        )
    if "recording" not in fields:
        return None
    if not cut.has_recording:
        raise ValueError(f"cut {cut.id} has no recording to write: export --fields features")
    return "flac" if audio_format == "flac" else _input_codec(cut)


def _load(cut: Cut, fields: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Per field, the cut's data in memory: audio (channels, samples), features (frames,
    bins). Raises `_Unreadable` for a missing, truncated or corrupt file."""
    data = {}
    try:
        if "recording" in fields:
            data["recording"] = cut.load_audio()
    except FILE_ERRORS as err:
        raise _Unreadable(f"unreadable audio ({first_line(err)})") from err
    try:
        if "features" in fields:
            data["features"] = np.asarray(cut.load_features())
    except FEATURE_FILE_ERRORS as err:
        raise _Unreadable(f"unreadable features ({first_line(err)})") from err
    return data


def _input_codec(cut: Cut) -> str:
    """The codec of `cut`'s audio file, which `audio_format="original"` keeps."""
    try:
        codec = cut.recording.source_format
    except NotImplementedError:  # sources of several codecs, or a command's output
        codec = "unknown"
    if codec not in WRITABLE_CODECS:
        raise ValueError(
            f"cut {cut.id}: audio format 'original' keeps only {', '.join(WRITABLE_CODECS)} "
            f"audio, and its audio is '{codec}': export with audio format flac"
        )
    return codec


def _write(writer: SharWriter, cut: Cut, data: dict[str, np.ndarray], codec: str | None) -> None:
    """Write `cut` with its loaded `data`: each field's tar entry, then its cut line.

    What `SharWriter.write` does for these two fields, from data loaded beforehand
    (`SharWriter.write` loads each field's data itself, between writing one field's entry
    and the next one's)."""
    if "recording" in data:
        recording = to_shar_placeholder(cut.recording, cut)
        channels = cut.channel if isinstance(cut.channel, list) else [cut.channel]
        if recording.channel_ids != channels:  # the cut holds some of the channels
            recording.sources[0].channels = channels
            recording.channel_ids = channels
        writer.writers["recording"].write(
            cut.id,
            data["recording"],
            cut.sampling_rate,
            manifest=recording,
            original_format=codec,
        )
        cut = fastcopy(cut, recording=recording)
    elif cut.has_recording and cut.start != 0:
        # the cut's start becomes 0 (it is the start of its stored features), which would
        # point the audio reference at the wrong place
        cut = fastcopy(cut, recording=None)
    if "features" in data:
        features = to_shar_placeholder(cut.features, cut)
        writer.writers["features"].write(cut.id, data["features"], manifest=features)
        cut = fastcopy(cut, features=features)
    writer.writers["cuts"].write(fastcopy(cut, start=0))


@contextmanager
def local_http_server(directory: str | Path) -> Iterator[str]:
    """Within: `directory` served by `python -m http.server` on 127.0.0.1, at a port the
    system picks; yields its URL. The object-storage path without leaving the machine (the
    loading benchmark, the tests of reading shards by URL)."""
    server = subprocess.Popen(
        [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1",
         "--directory", str(directory)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        line = server.stdout.readline()  # "Serving HTTP on 127.0.0.1 port N (...) ..."
        if " port " not in line:
            raise RuntimeError(f"python -m http.server did not start: {line.strip()!r}")
        yield f"http://127.0.0.1:{int(line.split(' port ')[1].split()[0])}"
    finally:
        server.terminate()
        server.wait(timeout=10)


def shar_fields(source: str) -> dict[str, list[str]]:
    """The shard files of the Shar directory `source`, per field ("cuts" first), in order:
    paths for a local directory (from its `shar_index.json`, else its shard files sorted by
    number), full URLs for an http(s) URL (from its `shar_index.json`: a URL cannot be
    listed). Raises naming `source` when there is no directory, index or shard, or when the
    fields have different numbers of shards."""
    source = str(source)
    if source.startswith(("http://", "https://")):
        base = source.rstrip("/")
        names = _index_fields(_read_url(f"{base}/{INDEX}"), f"{base}/{INDEX}")
        fields = {field: [f"{base}/{name}" for name in files] for field, files in names.items()}
    else:
        directory = Path(source)
        if not directory.is_dir():
            raise FileNotFoundError(f"Shar directory not found: {source}")
        index = directory / INDEX
        if index.is_file():
            names = _index_fields(index.read_text(), str(index))
        else:
            names = _listed_fields(directory)
        fields = {
            field: [str(directory / name) for name in files] for field, files in names.items()
        }
    counts = {field: len(files) for field, files in fields.items()}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{field} {n}" for field, n in counts.items())
        raise ValueError(
            f"Shar source {source}: the fields have different numbers of shards ({listed})"
        )
    return fields


def _read_url(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.read().decode()
    except urllib.error.HTTPError as err:
        raise FileNotFoundError(
            f"cannot read {url} (HTTP {err.code} {err.reason}): a Shar directory served over "
            f"HTTP is read from its {INDEX}, which asr-export-shar writes"
        ) from None
    except urllib.error.URLError as err:
        raise OSError(f"cannot read {url}: {err.reason}") from None


def _index_fields(text: str, where: str) -> dict[str, list[str]]:
    """The shard files per field listed by an index (its text, read from `where`)."""
    try:
        fields = json.loads(text)["fields"]
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{where} is not a Shar index ({first_line(err)})") from None
    if "cuts" not in fields:
        raise ValueError(f"{where} lists no cuts shards")
    return {"cuts": list(fields["cuts"]), **{f: list(n) for f, n in fields.items() if f != "cuts"}}


def _listed_fields(directory: Path) -> dict[str, list[str]]:
    """The shard files of `directory` per field, sorted by shard number (never by name
    alone: an unsorted or text-sorted listing pairs one shard's cuts with another's
    audio). Every field must have the same shard numbers."""
    numbers: dict[str, dict[int, str]] = {}
    for path in directory.iterdir():
        found = _SHARD_NAME.match(path.name)
        if found:
            numbers.setdefault(found["field"], {})[int(found["number"])] = path.name
    if "cuts" not in numbers:
        raise FileNotFoundError(
            f"no Shar shards (cuts.NNNNNN.jsonl.gz) and no {INDEX} in {directory}"
        )
    expected = sorted(numbers["cuts"])
    for field, shards in numbers.items():
        if sorted(shards) != expected:
            missing = sorted(set(expected) ^ set(shards))[0]
            raise ValueError(
                f"Shar directory {directory}: shard {missing} is missing from one field "
                f"({field} has {len(shards)} shards, cuts {len(expected)})"
            )
    ordered = {"cuts": numbers.pop("cuts"), **dict(sorted(numbers.items()))}
    return {field: [shards[n] for n in expected] for field, shards in ordered.items()}


class _Stderr:
    """Whatever `sys.stderr` is when a line is logged: while the progress bar is drawn, rich
    replaces it with a stream that prints above the bar (a handler holding the original
    stream would write into the bar)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


@command
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="asr-export-shar",
        description="Write cut manifests as lhotse Shar shards (sequential reads, local or "
        "by URL), with an index of the shard files.",
    )
    parser.add_argument("cuts", type=Path, nargs="+", help="cut manifests, written in order")
    parser.add_argument("-o", "--output-dir", type=Path, required=True, help="new directory")
    parser.add_argument("--shard-size", type=int, default=1000, help="cuts per shard")
    parser.add_argument(
        "--fields", nargs="+", choices=FIELDS, default=["recording"],
        help="recording (audio), features (stored features), or both",
    )  # fmt: skip
    parser.add_argument(
        "--audio-format", choices=AUDIO_FORMATS, default="flac",
        help="flac, or original: each file's own codec (wav, flac, mp3, opus), re-encoded",
    )  # fmt: skip
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=_Stderr()
    )
    cuts = functools.reduce(operator.add, [load_cuts(path) for path in args.cuts])
    export = export_shar(
        cuts, args.output_dir, fields=args.fields, shard_size=args.shard_size,
        audio_format=args.audio_format,
    )  # fmt: skip
    skipped = f", {export.skipped} unreadable skipped" if export.skipped else ""
    shards = f"{export.shards} shard{'s' if export.shards > 1 else ''}"
    print(
        f"wrote {export.cuts} cuts ({export.duration / 3600:.2f} h{skipped}) in {shards} of "
        f"{' + '.join(args.fields)} to {args.output_dir} (index: {args.output_dir / INDEX})"
    )


if __name__ == "__main__":
    main()
