"""Time and peak memory of `asr-train-lm` on given text and on synthetic text. Prints one
JSON object.

    python scripts/benchmark_train_lm.py --tokenizer data/demo/tokenizer/bpe128.model \\
        --text data/demo/manifests/librispeech_supervisions_train-clean-100.jsonl.gz \\
        --synthetic-tokens 10000000 --orders 3 6

Each run is `asr-train-lm TEXT --tokenizer ... --order N -o WORK/lm.arpa` in a child
process: its wall time, and its peak resident set (``ru_maxrss`` of the rusage that
`os.wait4` returns for that child: the kernel's high-water mark of the whole process, not a
sample; the child is forked from a small launcher, since a child's ``ru_maxrss`` counts the
image it was forked from). A first run on a one-sentence text gives the baseline (the
interpreter and the imports: numpy, sentencepiece, rich). Per run: the peak, the distinct
n-grams of each order and in all, the bytes per distinct n-gram and the tokens per GiB (both
from the peak above the baseline: meaningful for large texts only), the ARPA file's size,
and the command's own seconds of counting (with reading and tokenizing), estimating and
writing.

Texts (`--text`): plain or gzipped files of one sentence a line, or lhotse manifests
(``*.jsonl``, ``*.jsonl.gz``), whose supervisions' ``text`` (of cuts or supervisions) are
written out to a text file first.

Synthetic text (`--synthetic-tokens N`, N SentencePiece tokens counting ``</s>``): sentences
of 4-30 words drawn by a seeded first-order Markov chain over a word list (`--words`,
50 000): the given texts' words, most frequent first, then words made of 1-3 of the
tokenizer's pieces, so that the vocabulary keeps growing with the text as real text's does.
Each word either follows the word before from that word's list of 50 successors
(probability 0.7, the list Zipf distributed), or is drawn afresh with Zipf weights (exponent
1.1) over the word list. The successor lists make phrases repeat: in 1 M tokens, 0.58
distinct 6-grams of pieces per token with them, 0.80 without. ``calibration`` compares the
distinct n-grams of orders 1-6 per token of the first text and of the synthetic text at the
first text's size: on the demo's transcripts (sentences of a small grammar, 1 799 words) the
synthetic text has about as many 4- to 6-grams per token and more 2- and 3-grams.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from asr.data.tokenizer import Tokenizer
from asr.decoding.kneser_ney import KneserNeyCounter

SUCCESSORS = 50  # a word's list of likely next words
FOLLOW = 0.7  # the chance that a word comes from the previous word's list
ZIPF = 1.1
# Runs a command in a child of its own and writes the child's exit code and ru_maxrss (KiB)
# to argv[1]. A child's ru_maxrss counts the image it was forked from (the high-water mark
# survives exec), so the command is forked from this small process, not from the benchmark.
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}")
"""


def train_lm_command() -> list[str]:
    script = Path(sys.executable).with_name("asr-train-lm")
    if script.exists():
        return [str(script)]
    found = shutil.which("asr-train-lm")
    if found is None:
        raise SystemExit("asr-train-lm is not installed (pip install -e .)")
    return [found]


def read_lines(path: Path) -> list[str]:
    """Sentences of a text file or a lhotse manifest (see the module docstring)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        if ".jsonl" not in path.name:
            return [line.strip() for line in f if line.strip()]
        lines = []
        for row in f:
            item = json.loads(row)
            for sup in item.get("supervisions", [item]):
                if sup.get("text"):
                    lines.append(sup["text"].strip())
        return lines


def as_text_file(path: Path, work: Path) -> Path:
    if ".jsonl" not in path.name:
        return path
    out = work / (path.name.split(".jsonl")[0] + ".txt")
    out.write_text("\n".join(read_lines(path)) + "\n", encoding="utf-8")
    return out


def synthetic_text(
    tokens: int, words: list[str], tokenizer: Tokenizer, seed: int, out: Path
) -> Path:
    """About `tokens` tokens (with one </s> a sentence) of Markov-chain sentences over
    `words`, ranked most frequent first (see the module docstring)."""
    rng = np.random.default_rng(seed)
    pieces_of = np.array([len(tokenizer.encode(w)) for w in words])
    ranks = np.arange(1, len(words) + 1)
    zipf = ranks**-ZIPF
    zipf /= zipf.sum()
    successors = rng.choice(len(words), size=(len(words), SUCCESSORS), p=zipf)
    follow_weights = np.arange(1, SUCCESSORS + 1) ** -ZIPF
    follow_weights /= follow_weights.sum()
    per_sentence = 17 * pieces_of[rng.choice(len(words), 10_000, p=zipf)].mean() + 1
    sentences = int(tokens / per_sentence * 1.1) + 10
    lengths = rng.integers(4, 31, sentences)
    total_words = int(lengths.sum())
    fresh = rng.choice(len(words), total_words, p=zipf).tolist()
    follows = (rng.random(total_words) < FOLLOW).tolist()
    slot = rng.choice(SUCCESSORS, total_words, p=follow_weights).tolist()
    successor_lists = successors.tolist()
    counts = pieces_of.tolist()
    written = 0
    i = 0
    with open(out, "w", encoding="utf-8") as f:
        for length in lengths.tolist():
            sentence = []
            prev = None
            for _ in range(length):
                w = successor_lists[prev][slot[i]] if prev is not None and follows[i] else fresh[i]
                i += 1
                sentence.append(w)
                prev = w
            f.write(" ".join(words[w] for w in sentence) + "\n")
            written += sum(counts[w] for w in sentence) + 1
            if written >= tokens:
                break
    if written < tokens:
        raise RuntimeError(f"synthetic text came short: {written} of {tokens} tokens")
    return out


def piece_words(tokenizer: Tokenizer, count: int, seed: int) -> list[str]:
    """Up to `count` words of 1-3 pieces of the tokenizer (the first one word-initial), in
    a seeded random order."""
    rng = random.Random(seed)
    pieces = [tokenizer.id_to_piece(i) for i in range(4, tokenizer.vocab_size)]
    starts = [p[1:] for p in pieces if p.startswith("\u2581") and len(p) > 1]
    inner = [p for p in pieces if not p.startswith("\u2581")]
    words = {
        rng.choice(starts) + "".join(rng.choices(inner, k=rng.randint(0, 2)))
        for _ in range(count * 2)
    }
    return rng.sample(sorted(words), min(count, len(words)))


def distinct_per_token(path: Path, tokenizer: Tokenizer, tokens: int, order: int = 6):
    """Distinct n-grams of each order per token, over the first `tokens` tokens."""
    counter = KneserNeyCounter(order, tokenizer.id_to_piece)
    for line in path.read_text(encoding="utf-8").splitlines():
        counter.add(tokenizer.encode(line))
        if counter.tokens >= tokens:
            break
    counts = counter.estimate_tables().counts()
    return {"tokens": counter.tokens, "per_token": [round(c / counter.tokens, 3) for c in counts]}


def run(text: Path, tokenizer: Path, order: int, work: Path) -> dict:
    """One `asr-train-lm` run in a child process: wall seconds, peak RSS and its output."""
    output = work / "lm.arpa"
    log = work / "train_lm.log"
    command = [*train_lm_command(), str(text), "--tokenizer", str(tokenizer)]
    command += ["--order", str(order), "-o", str(output)]
    usage = work / "usage.txt"
    started = time.perf_counter()
    with open(log, "w") as out:
        subprocess.run(
            [sys.executable, "-S", "-c", LAUNCHER, str(usage), *command],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    seconds = time.perf_counter() - started
    returncode, max_rss_kib = map(int, usage.read_text().split())
    printed = log.read_text()
    if returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{printed[-2000:]}")
    ngrams = [int(n) for n in re.findall(r"^\s+\d+-grams: (\d+)$", printed, re.M)]
    tokens = int(re.search(r"(\d+) tokens \(with </s>\)", printed).group(1))
    phases = re.search(
        r"seconds: counting ([\d.]+), estimating ([\d.]+), writing ([\d.]+)", printed
    )
    result = {
        "text": str(text),
        "order": order,
        "tokens": tokens,
        "seconds": round(seconds, 2),
        "seconds_counting_estimating_writing": [float(x) for x in phases.groups()],
        "peak_rss_mb": round(max_rss_kib / 1024, 1),
        "ngrams": ngrams,
        "distinct_ngrams": sum(ngrams),
        "arpa_mb": round(output.stat().st_size / 2**20, 1),
    }
    output.unlink()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="SentencePiece model")
    parser.add_argument(
        "--text", type=Path, nargs="*", default=[], help="text files or lhotse manifests"
    )
    parser.add_argument(
        "--synthetic-tokens", type=int, default=10_000_000, help="0: no synthetic run"
    )
    parser.add_argument("--orders", type=int, nargs="+", default=[3, 6])
    parser.add_argument(
        "--words", type=int, default=50_000, help="synthetic text's word list (Zipf ranked)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/benchmark_train_lm"))
    args = parser.parse_args()
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.load(args.tokenizer)

    tiny = work / "one_sentence.txt"
    tiny.write_text("A\n")
    baseline = run(tiny, args.tokenizer, 3, work)["peak_rss_mb"]
    report: dict = {"baseline_rss_mb": baseline, "runs": []}
    texts = [as_text_file(p, work) for p in args.text]
    if args.synthetic_tokens:
        vocabulary = []
        if texts:
            words = Counter(w for p in texts for line in read_lines(p) for w in line.split())
            vocabulary = [w for w, _ in words.most_common()]
        if len(vocabulary) < args.words:  # then rarer words made of the tokenizer's pieces
            known = set(vocabulary)
            made = piece_words(tokenizer, 2 * args.words, args.seed)
            vocabulary += [w for w in made if w not in known][: args.words - len(vocabulary)]
        started = time.perf_counter()
        synthetic = synthetic_text(
            args.synthetic_tokens,
            vocabulary,
            tokenizer,
            args.seed,
            work / f"synthetic_{args.synthetic_tokens}.txt",
        )
        report["synthetic"] = {
            "words": len(vocabulary),
            "seconds_to_write": round(time.perf_counter() - started, 1),
        }
        if texts:
            real = distinct_per_token(texts[0], tokenizer, 10**12)
            report["calibration"] = {
                "text": real,
                "synthetic": distinct_per_token(synthetic, tokenizer, real["tokens"]),
            }
        texts.append(synthetic)
    for text in texts:
        for order in args.orders:
            result = run(text, args.tokenizer, order, work)
            above = max(result["peak_rss_mb"] - baseline, 1e-9) * 2**20
            result["bytes_per_ngram"] = round(above / result["distinct_ngrams"], 1)
            result["tokens_per_gib"] = int(result["tokens"] * 2**30 / above)
            report["runs"].append(result)
            print(json.dumps(result), file=sys.stderr)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
