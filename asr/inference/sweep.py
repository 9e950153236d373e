"""`asr-sweep`: choose the LM, LODR and biasing weights on your own dev set.

    asr-sweep exp/demo/model.bundle.pt data/demo/manifests/librispeech_cuts_dev-clean.jsonl.gz \\
        --lm lm.arpa --lm-weight 0,0.1,0.2,0.3 --lodr lodr.arpa --lodr-weight 0,0.05,0.1 \\
        --beam-size 8 --output sweep.json

The manifest's utterances are read and encoded once (`encode_manifest`); then the search
runs once per combination of the weights given (every LM weight with every LODR weight
with every biasing score), and a markdown table of the WER of each is printed, the best
(lowest WER) marked. With `--biasing-phrases`, the table also gives the phrase recall: of
the list's phrases that a reference holds as whole words (case aside), the share its
hypothesis holds too (the recall of scripts/benchmark_context.py, for any manifest).
`--output` writes the table as JSON. An utterance whose audio cannot be read counts as all
deletions, as in asr-decode.

Choose the weights on a dev set and report the WER on a test set that played no part in
choosing them: a weight chosen on the test set itself flatters it.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.progress import Progress

from asr.cli import command
from asr.decoding.biasing import (
    DEFAULT_BIASING_SCORE,
    BiasingGraph,
    BiasingPhrase,
    check_biasing_score,
    read_biasing_phrases,
)
from asr.decoding.fusion import MAX_LM_WEIGHT, LmFusion, check_lm_weight
from asr.decoding.search import SearchOptions, decode
from asr.errors import InputFault
from asr.inference.language_model import DEFAULT_LM_WEIGHT, DEFAULT_LODR_WEIGHT
from asr.inference.manifest_decoding import EncodedManifest, encode_manifest
from asr.inference.recognizer import Recognizer, load_recognizer
from asr.inference.streaming import chunking_of_ms
from asr.metrics import ErrorCounts, word_errors

log = logging.getLogger(__name__)

# What each list defaults to when its file is given without one.
DEFAULT_LM_WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7)
DEFAULT_LODR_WEIGHTS = (0.0, 0.1, 0.2, 0.3)
DEFAULT_BIASING_SCORES = (0.0, 2.0, DEFAULT_BIASING_SCORE, 6.0)


@dataclass(frozen=True)
class Setting:
    """One combination of the sweep (None: that part is not swept)."""

    lm_weight: float | None = None
    lodr_weight: float | None = None
    biasing_score: float | None = None


@dataclass(frozen=True)
class Scored:
    """A setting's result: its word errors over every utterance and, with phrases, the
    phrase recall (None: no reference holds one of the phrases)."""

    setting: Setting
    errors: ErrorCounts
    recall: float | None = None

    @property
    def wer(self) -> float:
        return 100 * self.errors.wer

    def row(self) -> dict:
        row = {k: v for k, v in self.setting.__dict__.items() if v is not None}
        row["wer"] = round(self.wer, 3)
        row |= self.errors.__dict__
        if self.setting.biasing_score is not None:
            row["recall"] = None if self.recall is None else round(self.recall, 4)
        return row


def _normalized(text: str) -> str:
    return " " + " ".join(text.casefold().split()) + " "


def phrase_recall(
    references: Sequence[str], hypotheses: Sequence[str], phrases: Sequence[str]
) -> float | None:
    """Of the `phrases` that a reference holds as whole words (case aside), counted once per
    utterance, the share whose hypothesis holds them too; None when no reference holds one."""
    wanted = [_normalized(p) for p in phrases if p.strip()]
    said = found = 0
    for ref, hyp in zip(references, hypotheses, strict=True):
        ref, hyp = _normalized(ref), _normalized(hyp)
        for phrase in wanted:
            if phrase in ref:
                said += 1
                found += phrase in hyp
    return found / said if said else None


@torch.inference_mode()
def search_texts(
    recognizer: Recognizer,
    encoded: EncodedManifest,
    options: SearchOptions,
    biasing: BiasingGraph | None,
    lm: LmFusion | None,
    advance: Callable[[int], None] = lambda n: None,
) -> list[str]:
    """The best hypothesis of every cut of `encoded` (`encoded.cuts`' order; an unreadable
    cut's is empty)."""
    texts = []
    for batch in encoded.batches:
        ids = decode(recognizer.model, batch.encoder_out, batch.encoder_lens, options, biasing, lm)
        texts += [recognizer.tokenizer.decode(i) for i in ids]
        advance(len(batch.cuts))
    return texts + [""] * len(encoded.unreadable)


def sweep(
    recognizer: Recognizer,
    encoded: EncodedManifest,
    settings: Sequence[Setting],
    lm: LmFusion | None = None,
    phrases: Sequence[BiasingPhrase] = (),
    progress: Progress | None = None,
) -> list[Scored]:
    """Every setting's WER (and phrase recall) over `encoded`: `lm` holds the LM and LODR
    tables that each setting's weights apply to; `phrases`: the list boosted at each
    setting's biasing score; `progress`: where to show a bar over the settings (and one
    over the utterances of each)."""
    references = encoded.references
    texts = [p.text for p in phrases]
    graphs: dict[float, BiasingGraph] = {}
    fusions: dict[tuple[float, float], LmFusion | None] = {}
    utterances = sum(len(b.cuts) for b in encoded.batches)
    results = []
    combos = None if progress is None else progress.add_task("sweep", total=len(settings))
    for setting in settings:
        graph = None
        if setting.biasing_score is not None:
            score = setting.biasing_score
            if score not in graphs:
                graphs[score] = BiasingGraph.from_phrases(phrases, recognizer.tokenizer, score)
            graph = graphs[score]
        fusion = None
        weights = (setting.lm_weight or 0.0, setting.lodr_weight or 0.0)
        if lm is not None and weights != (0.0, 0.0):  # both 0: the search without an LM
            if weights not in fusions:
                fusions[weights] = LmFusion(lm.lm, weights[0], lm.lodr, weights[1])
            fusion = fusions[weights]
        task = None
        if progress is not None:
            task = progress.add_task(f"  {_describe(setting)}", total=utterances)
        advance = functools.partial(_advance, progress, task)
        hyps = search_texts(recognizer, encoded, recognizer.options, graph, fusion, advance)
        if progress is not None:
            progress.remove_task(task)
            progress.advance(combos)
        errors = ErrorCounts()
        for ref, hyp in zip(references, hyps, strict=True):
            errors = errors + word_errors(ref, hyp)
        recall = phrase_recall(references, hyps, texts) if graph is not None else None
        results.append(Scored(setting, errors, recall))
    return results


def _advance(progress: Progress | None, task: object, n: int) -> None:
    if progress is not None:
        progress.advance(task, n)


def _describe(setting: Setting) -> str:
    parts = []
    if setting.lm_weight is not None:
        parts.append(f"--lm-weight {setting.lm_weight:g}")
    if setting.lodr_weight is not None:
        parts.append(f"--lodr-weight {setting.lodr_weight:g}")
    if setting.biasing_score is not None:
        parts.append(f"--biasing-score {setting.biasing_score:g}")
    return " ".join(parts) or "no LM, no phrases"


def best_of(results: Sequence[Scored]) -> Scored:
    """The lowest WER; on a tie, the higher recall, then the first (the smaller weights,
    as the lists are given)."""
    return min(results, key=lambda r: (r.errors.errors, -(r.recall or 0.0)))


def markdown_table(results: Sequence[Scored], best: Scored) -> str:
    """The results as a markdown table, the best row marked."""
    first = results[0].setting
    columns: list[tuple[str, Callable[[Scored], str]]] = []
    if first.lm_weight is not None:
        columns.append(("LM weight", lambda r: f"{r.setting.lm_weight:g}"))
    if first.lodr_weight is not None:
        columns.append(("LODR weight", lambda r: f"{r.setting.lodr_weight:g}"))
    if first.biasing_score is not None:
        columns.append(("biasing score", lambda r: f"{r.setting.biasing_score:g}"))
    columns.append(("WER %", lambda r: f"{r.wer:.2f}"))
    columns.append(
        (
            "sub / del / ins",
            lambda r: f"{r.errors.substitutions} / {r.errors.deletions} / {r.errors.insertions}",
        )
    )
    if first.biasing_score is not None:
        columns.append(
            ("phrase recall", lambda r: "-" if r.recall is None else f"{100 * r.recall:.1f} %")
        )
    columns.append(("", lambda r: "**best**" if r is best else ""))
    lines = [
        "| " + " | ".join(name for name, _ in columns) + " |",
        "|" + "|".join("---:" if name else "---" for name, _ in columns) + "|",
    ]
    lines += ["| " + " | ".join(cell(r) for _, cell in columns) + " |" for r in results]
    return "\n".join(lines)


def _values(check: Callable[[str], float]) -> Callable[[str], list[float]]:
    """An argparse type: a comma-separated list of values, each checked by `check`."""

    def parse(text: str) -> list[float]:
        items = [t.strip() for t in text.split(",")]
        if not items or not all(items):
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
        try:
            values = [check(t) for t in items]
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        if len(set(values)) < len(values):
            raise argparse.ArgumentTypeError(f"a value is given twice in {text!r}")
        return values

    return parse


def _weight(text: str) -> float:
    return check_lm_weight("each weight", text)


def _score(text: str) -> float:
    return check_biasing_score(text, "each score")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asr-sweep",
        description="Decode a dev manifest once per combination of LM, LODR and biasing "
        "weights (the encoder runs once) and print the WER of each as a markdown table, "
        "the best marked: choose the weights on a dev set, report on a test set.",
    )
    parser.add_argument("model", type=Path, help="bundle (asr-export) or checkpoint")
    parser.add_argument("manifest", type=Path, help="a lhotse cut manifest (.jsonl.gz)")
    parser.add_argument(
        "--lm",
        type=Path,
        default=None,
        metavar="ARPA",
        help="a token n-gram over the model's pieces (asr-train-lm; ARPA, plain or gzipped)",
    )
    parser.add_argument(
        "--lm-weight",
        type=_values(_weight),
        default=None,
        metavar="W,W,...",
        help="--lm: the LM weights to try (default "
        f"{','.join(f'{w:g}' for w in DEFAULT_LM_WEIGHTS)}; each 0 to {MAX_LM_WEIGHT:g}; "
        f"asr-decode's --lm-weight defaults to {DEFAULT_LM_WEIGHT:g})",
    )
    parser.add_argument(
        "--lodr",
        type=Path,
        default=None,
        metavar="ARPA",
        help="--lm: a low-order n-gram of the training transcripts, subtracted (LODR)",
    )
    parser.add_argument(
        "--lodr-weight",
        type=_values(_weight),
        default=None,
        metavar="W,W,...",
        help="--lodr: the LODR weights to try (default "
        f"{','.join(f'{w:g}' for w in DEFAULT_LODR_WEIGHTS)}; asr-decode's --lodr-weight "
        f"defaults to {DEFAULT_LODR_WEIGHT:g})",
    )
    parser.add_argument(
        "--biasing-phrases",
        type=Path,
        default=None,
        metavar="FILE",
        help="phrases to boost, one per line (docs/decoding.md#context-biasing): adds the "
        "phrase recall to the table",
    )
    parser.add_argument(
        "--biasing-score",
        type=_values(_score),
        default=None,
        metavar="S,S,...",
        help="--biasing-phrases: the bonuses per token to try (default "
        f"{','.join(f'{s:g}' for s in DEFAULT_BIASING_SCORES)})",
    )
    parser.add_argument("--beam-size", type=int, default=1, help="1: greedy; more: beam search")
    parser.add_argument(
        "--max-symbols-per-frame",
        type=int,
        default=None,
        help="transducers: at most N tokens per encoder frame (default 3)",
    )
    parser.add_argument("--max-duration", type=float, default=200.0, help="seconds per batch")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--chunk-ms",
        type=float,
        default=None,
        help="a streaming model decoded through the masks of a chunk of this many "
        "milliseconds, one it was trained with (what streaming gives)",
    )
    parser.add_argument(
        "--left-context-ms",
        type=float,
        default=None,
        help="with --chunk-ms: this many milliseconds of left context (default: the largest)",
    )
    parser.add_argument(
        "-o", "--output", type=Path, default=None, help="write the table as JSON here"
    )
    return parser


def settings_of(args: argparse.Namespace) -> list[Setting]:
    """Every combination the arguments ask for, in the order given (LM weight outermost)."""
    lm = args.lm_weight or (list(DEFAULT_LM_WEIGHTS) if args.lm else [None])
    lodr = args.lodr_weight or (list(DEFAULT_LODR_WEIGHTS) if args.lodr else [None])
    scores = args.biasing_score or (
        list(DEFAULT_BIASING_SCORES) if args.biasing_phrases else [None]
    )
    combos = list(itertools.product(lm, lodr, scores))
    # (a LODR weight above the LM's is refused: `check_lodr_below_lm`)
    kept = [c for c in combos if c[0] is None or c[1] is None or c[1] <= c[0]]
    if len(kept) < len(combos):
        print(f"skipping {len(combos) - len(kept)} combinations with a LODR weight above the LM's")
    return [Setting(*combo) for combo in kept]


def _check_pairs(args: argparse.Namespace) -> None:
    for value, option, needs, need in (
        (args.lm_weight, "--lm-weight", args.lm, "--lm ARPA"),
        (args.lodr, "--lodr", args.lm, "--lm ARPA"),
        (args.lodr_weight, "--lodr-weight", args.lodr, "--lodr ARPA"),
        (args.biasing_score, "--biasing-score", args.biasing_phrases, "--biasing-phrases FILE"),
    ):
        if value is not None and needs is None:
            raise ValueError(f"{option} goes with {need}")
    if args.left_context_ms is not None and args.chunk_ms is None:
        raise ValueError("--left-context-ms goes with --chunk-ms")


@command
def main(argv: list[str] | None = None) -> None:
    """`asr-sweep MODEL MANIFEST --lm lm.arpa --lm-weight 0,0.1,0.2 ...`: the WER of every
    combination of weights, as a markdown table."""
    args = _parser().parse_args(argv)
    _check_pairs(args)
    if not args.manifest.is_file():
        raise FileNotFoundError(f"manifest not found: {args.manifest}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    phrases = read_biasing_phrases(args.biasing_phrases) if args.biasing_phrases else []
    recognizer = load_recognizer(
        args.model, args.device, args.beam_size, args.max_symbols_per_frame
    )
    if args.chunk_ms is not None:
        chunking = chunking_of_ms(recognizer.model, args.chunk_ms, args.left_context_ms)
        recognizer = recognizer.with_chunking(chunking)
    fusion = None
    if args.lm is not None:
        try:  # the tables, loaded once; each setting applies its own weights to them
            fusion = recognizer.language_model(args.lm, 0.0, args.lodr, 0.0 if args.lodr else None)
        except MemoryError as err:
            raise InputFault(str(err)) from None
    settings = settings_of(args)
    encoded = encode_manifest(recognizer, args.manifest, args.max_duration)
    if encoded.unreadable:
        log.warning(
            "%d utterance(s) had unreadable audio and count as all deletions",
            len(encoded.unreadable),
        )
    with Progress(transient=True) as progress:
        results = sweep(recognizer, encoded, settings, fusion, phrases, progress)
    best = best_of(results)
    print(markdown_table(results, best))
    utterances = len(encoded.cuts)
    words = results[0].errors.ref_words
    print(f"\nbest: {_describe(best.setting)}: WER {best.wer:.2f}% on {words} words")
    if args.output is not None:
        report = {
            "model": str(args.model),
            "manifest": str(args.manifest),
            "beam_size": args.beam_size,
            "lm": None if args.lm is None else str(args.lm),
            "lodr": None if args.lodr is None else str(args.lodr),
            "biasing_phrases": None if args.biasing_phrases is None else str(args.biasing_phrases),
            "chunk_ms": args.chunk_ms,
            "utterances": utterances,
            "utterances_skipped": len(encoded.unreadable),
            "ref_words": words,
            "results": [r.row() for r in results],
            "best": best.row(),
        }
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.output}", file=sys.stderr)
