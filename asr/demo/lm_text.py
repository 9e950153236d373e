"""Text for the demo's language model: sentences of the demo's grammar that no dev or test
utterance holds.

The demo synthesizer can write sentences that it never speaks. `make_lm_text` draws them
from the grammar the corpus plan uses (`asr.demo.lexicon.Grammar` over the whole lexicon,
the plan's length limits of `MIN_WORDS` to `MAX_WORDS` words), from a seeded stream of
its own ("<seed>:lm-text", which no part of the plan uses), and writes them upper case,
as the transcripts are, one a line, gzipped.

Excluded: every sentence of the corpus's dev and test parts, so that an LM trained on the
text has never seen a sentence it is measured on. They are read from the transcripts
under OUT/LibriSpeech of dev-clean and test-clean (required), dev-other and test-other
(`--librispeech-parts`), and the context sets of `asr.demo.context_sets`: test-context,
test-plain, dev-context and dev-plain. The context sets' sentences are also planned from
the training transcripts with `asr-make-context-sets`'s defaults (pure and cheap), so
that text made before the sets are synthesized excludes them too (none on a corpus too
small for them). A drawn sentence that
one of these holds is dropped (counted) and another drawn in its place.

Included: the training transcripts' sentences, when the grammar draws them, as any other
(the text is independent draws from the grammar, repeats kept: its frequencies are the
grammar's); they are not added on their own (the recipe trains the LODR bigram on the
training transcripts separately).

Command line: ``asr-make-lm-text OUT [--corpus data/demo] [--sentences 200000] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import gzip
import io
import random
from collections.abc import Sequence
from pathlib import Path

from asr.cli import command
from asr.demo import lexicon as lex
from asr.demo.context_sets import (
    HELD_OUT_PARTS,
    plan_context_sets,
    plan_dev_sets,
    training_texts,
    transcripts,
)
from asr.demo.plan import (
    CONTEXT_PART,
    DEV_CONTEXT_PART,
    DEV_PLAIN_PART,
    MAX_WORDS,
    MIN_WORDS,
    PARTS,
    PLAIN_PART,
    SPOKEN_TEXT,
)

DEFAULT_SENTENCES = 200_000
CONTEXT_PARTS = (CONTEXT_PART, PLAIN_PART, DEV_CONTEXT_PART, DEV_PLAIN_PART)
EXCLUDED_PARTS = (*HELD_OUT_PARTS, *CONTEXT_PARTS)


def excluded_sentences(corpus_dir: str | Path) -> tuple[set[str], dict[str, int]]:
    """The sentences (lower case) of the dev and test parts of the demo corpus in
    `corpus_dir`, and how many each source gave: the transcripts of each part found
    (`EXCLUDED_PARTS`), and "planned context sets" (see the module's docstring). Raises
    FileNotFoundError naming the folder when dev-clean or test-clean has no transcripts."""
    root = Path(corpus_dir) / "LibriSpeech"
    excluded: set[str] = set()
    sources: dict[str, int] = {}
    for part in EXCLUDED_PARTS:
        texts = transcripts(root, [part])
        if texts:
            sources[part] = len(texts)
            excluded |= {" ".join(text.split()) for text in texts}
        elif part in PARTS:
            raise FileNotFoundError(
                f"{root / part}: no transcripts; the LM text must exclude the dev and test "
                "sentences of a demo corpus (make one first: asr-make-demo-corpus OUT)"
            )
    training = training_texts(root)
    try:
        test = plan_context_sets(training)
        dev = plan_dev_sets(training, test, held_out=transcripts(root, HELD_OUT_PARTS))
        planned = {utt.text for sets in (test, dev) for utt in sets.context + sets.plain}
    except (RuntimeError, ValueError):  # a corpus too small for the default sets: none
        planned = set()
    sources["planned context sets"] = len(planned)
    return excluded | planned, sources


def draw_sentences(
    n: int, excluded: set[str] | frozenset[str] = frozenset(), *, seed: int = 0
) -> tuple[list[str], int]:
    """`n` sentences of the demo's grammar (lower case) none of which is in `excluded`,
    and how many drawn sentences were dropped because `excluded` holds them."""
    grammar = lex.Grammar(random.Random(f"{seed}:lm-text"))
    sentences: list[str] = []
    dropped = 0
    while len(sentences) < n:
        words = grammar.sentence()
        if not MIN_WORDS <= len(words) <= MAX_WORDS:
            continue
        text = " ".join(words)
        if not SPOKEN_TEXT.fullmatch(text):
            raise ValueError(f"the grammar produced {text!r}: only a-z, ' and single spaces")
        if text in excluded:
            dropped += 1
            if dropped > 1000 + n:
                raise RuntimeError("the excluded sentences are most of what the grammar draws")
            continue
        sentences.append(text)
    return sentences, dropped


def make_lm_text(
    out: str | Path,
    corpus_dir: str | Path = "data/demo",
    *,
    sentences: int = DEFAULT_SENTENCES,
    seed: int = 0,
) -> dict:
    """Write `sentences` sentences of the demo's grammar, none of a dev or test part of the
    corpus in `corpus_dir`, to `out` (gzipped text, upper case, one a line; the same bytes
    for the same arguments and corpus). Returns a summary: "written", "dropped" (drawn
    sentences a dev or test part holds), "training" (written sentences that are training
    transcripts), "excluded" (sentences excluded) and "sources" (`excluded_sentences`)."""
    if sentences < 1 or seed < 0:
        raise ValueError(f"--sentences must be >= 1 and --seed >= 0, got {sentences}, {seed}")
    excluded, sources = excluded_sentences(corpus_dir)
    drawn, dropped = draw_sentences(sentences, excluded, seed=seed)
    training = {" ".join(t.split()) for t in training_texts(Path(corpus_dir) / "LibriSpeech")}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with (
        open(tmp, "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as packed,
        io.TextIOWrapper(packed, encoding="utf-8") as text,
    ):
        text.writelines(f"{sentence.upper()}\n" for sentence in drawn)
    tmp.replace(out)
    return {
        "written": len(drawn),
        "dropped": dropped,
        "training": sum(sentence in training for sentence in drawn),
        "distinct": len(set(drawn)),
        "excluded": len(excluded),
        "sources": sources,
    }


@command
def main(argv: Sequence[str] | None = None) -> None:
    """Console script `asr-make-lm-text OUT [--corpus DIR] [--sentences N] [--seed S]`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the text file to write (gzipped)")
    parser.add_argument(
        "--corpus", type=Path, default=Path("data/demo"),
        help="the demo corpus root (CORPUS/LibriSpeech) whose dev and test sentences are "
        "excluded (default data/demo)",
    )  # fmt: skip
    parser.add_argument("--sentences", type=int, default=DEFAULT_SENTENCES)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    summary = make_lm_text(args.out, args.corpus, sentences=args.sentences, seed=args.seed)
    sources = ", ".join(f"{name} {count}" for name, count in summary["sources"].items())
    print(f"excluded {summary['excluded']} dev and test sentences ({sources})")
    print(
        f"wrote {summary['written']} sentences ({summary['distinct']} distinct, "
        f"{summary['training']} of them training transcripts) to {args.out}; dropped "
        f"{summary['dropped']} drawn sentences that a dev or test part holds"
    )


if __name__ == "__main__":
    main()
