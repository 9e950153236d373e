"""The language model a recognizer fuses (`asr.decoding.fusion`), as its users give it: an
`LmFusion`, or the path of an ARPA file (or its cached tensor form) with a weight and,
optionally, a LODR LM with its own. The options of `asr-transcribe`, `asr-decode`,
`asr-serve` and `asr-sweep` (`--lm`, `--lm-weight`, `--lodr`, `--lodr-weight`) and the
`lm=` keywords of `Recognizer.transcribe` and `StreamingRecognizer.create_stream` all come
here.

A path is read once per recognizer (`FusionCache`, as `asr.decoding.fusion.load_fusion`
reads it: checked to fit the device before it moves there): its tensor form stays on the
recognizer's device and every weight it is asked with shares it; asking again with the
same file and weights gives the same `LmFusion` object, so that streams fused with it are
searched in one step (`asr.decoding.search.advance_each`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

import torch

from asr.data.tokenizer import Tokenizer
from asr.decoding.fusion import (
    MAX_LM_WEIGHT,
    LmFusion,
    TokenLm,
    check_lm_weight,
    load_token_lm,
    ready_for,
)
from asr.errors import InputFault

__all__ = [
    "DEFAULT_LM_WEIGHT",
    "DEFAULT_LODR_WEIGHT",
    "FusionCache",
    "LanguageModel",
    "add_lm_arguments",
    "check_lm_arguments",
    "check_lm_options",
    "language_model_of",
    "lm_description",
    "lm_settings",
]

# The weights used where a path is given without one: the best of the demo's dev-clean
# sweep for a beam of 8 (`asr-sweep`, LM 0-0.7 x LODR 0-0.3; recipes/demo/RESULTS.md,
# "Language models"), a 6-gram of the demo grammar's text and the LODR bigram of the
# training transcripts. Greedy search's best there was 0.3 / 0.3. icefall's LODR recipes
# use 0.1-0.6 for the LM and 0.1-0.2 for LODR: tune on your own dev set (`asr-sweep`).
DEFAULT_LM_WEIGHT = 0.4
DEFAULT_LODR_WEIGHT = 0.3

# What `lm=` takes: a built fusion, or the path of an LM file (None: no LM).
LanguageModel = LmFusion | str | Path | None


def check_lm_arguments(
    lm: object,
    lm_weight: float | None,
    lodr: object,
    lodr_weight: float | None,
    name: Callable[[str], str] = str,
) -> None:
    """A one-line ValueError for weights or a LODR LM without what they go with: a weight
    or `lodr` without `lm`, `lodr_weight` without `lodr`, any of them with a built
    `LmFusion` (it holds its own). `name` spells a keyword as its user typed it (the
    command lines: `--lm-weight`)."""
    given = [k for k, v in (("lm_weight", lm_weight), ("lodr", lodr)) if v is not None]
    if lodr_weight is not None:
        given.append("lodr_weight")
    if lm is None and given:
        raise ValueError(f"{name(given[0])} goes with {name('lm')} (a language model)")
    if isinstance(lm, LmFusion) and given:
        raise ValueError(
            f"{name(given[0])} goes with an LM file: an LmFusion holds its own weights and LODR"
        )
    if lodr is None and lodr_weight is not None:
        raise ValueError(f"{name('lodr_weight')} goes with {name('lodr')} (a LODR LM)")


class FusionCache:
    """A recognizer's language models: `get(lm, ...)` -> the `LmFusion` to search with,
    each file read once (over the pieces of `tokenizer`, listed when the first file is
    read) and kept on `device`."""

    def __init__(self, tokenizer: Tokenizer, device: torch.device | str) -> None:
        self.tokenizer = tokenizer
        self._pieces: list[str] | None = None
        self.device = torch.device(device)
        self._lms: dict[tuple, TokenLm] = {}  # by file (path, size, mtime)
        self._fusions: dict[tuple, LmFusion] = {}  # by files and weights

    def pieces(self) -> list[str]:
        """The tokenizer's pieces by id (what an LM file's tokens are matched to)."""
        if self._pieces is None:
            vocab = self.tokenizer.vocab_size
            self._pieces = [self.tokenizer.id_to_piece(i) for i in range(vocab)]
        return self._pieces

    @staticmethod
    def _file_key(path: str | Path) -> tuple:
        path = Path(path)
        try:
            stat = path.stat()
        except OSError:  # missing: load_fusion names it
            return (str(path),)
        return (str(path.resolve()), stat.st_size, stat.st_mtime_ns)

    def get(
        self,
        lm: LanguageModel,
        lm_weight: float | None = None,
        lodr: str | Path | None = None,
        lodr_weight: float | None = None,
    ) -> LmFusion | None:
        """The fusion `lm` stands for: None for None, an `LmFusion` as it is, and for a
        path the shallow fusion of that file with `lm_weight` (None: `DEFAULT_LM_WEIGHT`)
        minus the LODR LM `lodr` (None: none) with `lodr_weight` (None:
        `DEFAULT_LODR_WEIGHT`). Errors are one line: a missing file, an LM over another
        vocabulary, a weight outside 0 to `MAX_LM_WEIGHT` (ValueError or
        FileNotFoundError), tables too big for the device (MemoryError)."""
        check_lm_arguments(lm, lm_weight, lodr, lodr_weight)
        if lm is None or isinstance(lm, LmFusion):
            return lm
        if not isinstance(lm, str | os.PathLike):
            raise TypeError(f"lm is an LmFusion or the path of an LM file, not {lm!r}")
        weight = check_lm_weight("lm_weight", DEFAULT_LM_WEIGHT if lm_weight is None else lm_weight)
        lodr_w = 0.0
        if lodr is not None:
            lodr_w = DEFAULT_LODR_WEIGHT if lodr_weight is None else lodr_weight
            lodr_w = check_lm_weight("lodr_weight", lodr_w)
        files = (self._file_key(lm), None if lodr is None else self._file_key(lodr))
        key = (*files, weight, lodr_w)
        fusion = self._fusions.get(key)
        if fusion is not None:
            return fusion
        tables: list[TokenLm | None] = []
        for path, file in ((lm, files[0]), (lodr, files[1])):
            table = None if path is None else self._lms.get(file)
            if path is not None and table is None:
                table = load_token_lm(path, self.pieces())
                table = self._lms[file] = ready_for(table, self.device)  # checked, dense rows
            tables.append(table)
        fusion = LmFusion(tables[0], weight, tables[1], lodr_w)
        self._fusions[key] = fusion
        return fusion


# -- the command lines' options ---------------------------------------------------------
def add_lm_arguments(parser: argparse.ArgumentParser) -> None:
    """--lm, --lm-weight, --lodr and --lodr-weight: a language model to fuse
    (`asr.decoding.fusion`), in asr-transcribe, asr-decode and asr-serve."""
    parser.add_argument(
        "--lm",
        type=Path,
        default=None,
        metavar="ARPA",
        help="a token n-gram over the model's pieces (asr-train-lm --tokenizer; ARPA, plain "
        "or gzipped), fused with the search (shallow fusion): each token scores its "
        "log-probability plus --lm-weight times the LM's, and the end of the sentence is "
        "scored once at the end; with --biasing-phrases both scores add. Read once; its "
        "tables are cached beside it (<ARPA>.<vocabulary>.pt)",
    )
    parser.add_argument(
        "--lm-weight",
        type=_lm_weight,
        default=None,
        metavar="W",
        help=f"--lm: its weight (default {DEFAULT_LM_WEIGHT:g}; 0 to {MAX_LM_WEIGHT:g}, "
        "useful ones about 0.1-0.7; choose it on your dev set with asr-sweep)",
    )
    parser.add_argument(
        "--lodr",
        type=Path,
        default=None,
        metavar="ARPA",
        help="--lm: a low-order n-gram of the model's training transcripts (a bigram: "
        "asr-train-lm --order 2), subtracted with --lodr-weight (LODR: it stands in for the "
        "language the model learned from them, so that --lm is not counted twice)",
    )
    parser.add_argument(
        "--lodr-weight",
        type=_lm_weight,
        default=None,
        metavar="W",
        help=f"--lodr: its weight (default {DEFAULT_LODR_WEIGHT:g}; 0 to {MAX_LM_WEIGHT:g}; "
        "choose it with asr-sweep)",
    )


def _lm_weight(text: str) -> float:
    """`--lm-weight`'s and `--lodr-weight`'s value, checked (`check_lm_weight`)."""
    try:
        return check_lm_weight("the weight", text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _option(keyword: str) -> str:
    return "--" + keyword.replace("_", "-")


def check_lm_options(args: argparse.Namespace) -> None:
    """One line, before any model is read, for LM options without what they go with
    (--lm-weight or --lodr without --lm, --lodr-weight without --lodr) and for a missing
    file."""
    check_lm_arguments(args.lm, args.lm_weight, args.lodr, args.lodr_weight, _option)
    for path in (args.lm, args.lodr):
        if path is not None and not path.is_file():
            raise FileNotFoundError(f"language model not found: {path}")


def language_model_of(args: argparse.Namespace, recognizer) -> LmFusion | None:
    """The fusion of --lm, --lm-weight, --lodr and --lodr-weight for `recognizer` (read
    once, on its device), or None; tables too big for the device are one line."""
    try:
        return recognizer.language_model(args.lm, args.lm_weight, args.lodr, args.lodr_weight)
    except MemoryError as err:  # fusion's check_fits: the sizes, before decoding starts
        raise InputFault(str(err)) from None


def lm_description(args: argparse.Namespace, fusion: LmFusion | None) -> str:
    """What asr-serve's start-up line says of the LM (", LM lm.arpa x 0.3 - LODR
    lodr.arpa x 0.1"), or "" without one."""
    if fusion is None:
        return ""
    text = f", LM {args.lm} x {fusion.weight:g}"
    if args.lodr is not None:
        text += f" - LODR {args.lodr} x {fusion.lodr_weight:g}"
    return text


def lm_settings(args: argparse.Namespace, fusion: LmFusion | None) -> dict:
    """What asr-decode writes into wer.json about the LM (nothing without one)."""
    if fusion is None:
        return {}
    lm = {"lm": str(args.lm), "lm_weight": fusion.weight}
    if args.lodr is not None:
        lm |= {"lodr": str(args.lodr), "lodr_weight": fusion.lodr_weight}
    return {"language_model": lm}
