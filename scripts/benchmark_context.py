"""Context biasing and word confidence on the demo's test sets; prints JSON lines.

    asr-make-context-sets data/demo          # test-context, test-plain and the phrase lists
    python scripts/benchmark_context.py exp/demo/model.bundle.pt [--scores 1,2,3,4,4.5,5,6]
    python scripts/benchmark_context.py exp/demo_streaming/model.bundle.pt --chunk-ms 640

With `--chunk-ms` (a streaming model) utterances are encoded whole through the chunked
masks of that chunk, which gives exactly what streaming them gives (docs/streaming.md).

The sets (`asr.demo.context_sets`): test-context holds 50 names and rare words absent from
the training text, each in 2-3 sentences; test-plain is each sentence's twin with a
lexicon word in the phrase's place. The list of 100 phrases holds the 50 spoken ones and 50
that are never spoken. Features are computed and the encoder run once per set; only the
searches run per setting. Lines (`"section"`):

- `sweep`: per search (greedy, beams of 4 and 8) and per score (and without a list): phrase recall
  on test-context (the utterances whose hypothesis holds their phrase as whole words),
  WER on both sets, and how many hypotheses hold a phrase that was not said;
- `targets`: at the default score, whether recall rose by at least half of what was
  missed and test-plain's WER stayed within 0.3 points;
- `cost`: per search and list size (10, 100, 1000 phrases; 0: no list) the graph's
  states and build time, the search's milliseconds per utterance and the RTFx of
  encoder + search over both sets;
- `confidence`: on test-clean, how well word confidence separates right from wrong words
  (ROC AUC; a word is right where the alignment with the reference matches it) and a
  reliability table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jiwer
import torch
from rich.progress import track

from asr.benchmarks.rtfx import batches, utterance_features
from asr.data.corpus import cut_text, cuts_path, load_cuts
from asr.decoding.biasing import DEFAULT_BIASING_SCORE, BiasingGraph, read_biasing_phrases
from asr.decoding.search import SearchOptions, decode_timed
from asr.decoding.transducer import GreedyOptions
from asr.decoding.transducer_beam import BeamOptions
from asr.inference.recognizer import Recognizer, load_recognizer
from asr.inference.streaming import chunking_of_ms
from asr.metrics import corpus_errors

CONFIDENCE_BINS = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0)


def set_features(recognizer: Recognizer, manifest: Path) -> list[dict]:
    """`utterance_features`, or with a streaming chunk each utterance's features as a
    stream of it ends (`Recognizer.features_of`)."""
    if recognizer.chunking is None:
        return utterance_features(recognizer, manifest, None)
    return [
        {
            "id": cut.id,
            "feats": recognizer.features_of(cut.load_audio()[0]),
            "seconds": cut.duration,
            "text": cut_text(cut),
        }
        for cut in load_cuts(manifest)
    ]


@torch.inference_mode()
def encode_all(recognizer: Recognizer, utterances: list[dict], batch_size: int) -> list[dict]:
    """Per batch: its utterances, encoder output and lengths, and the encoder's seconds."""
    encoded = []
    for batch in batches(utterances, batch_size):
        start = time.perf_counter()
        enc, lens = recognizer._encode([u["feats"] for u in batch])
        encoded.append(
            {"utts": batch, "enc": enc, "lens": lens, "seconds": time.perf_counter() - start}
        )
    return encoded


@torch.inference_mode()
def search_all(
    recognizer: Recognizer,
    encoded: list[dict],
    options: SearchOptions,
    biasing: BiasingGraph | None,
) -> tuple[dict[str, list], float]:
    """Per utterance id its best hypothesis (`TimedTokens`), and the search's seconds."""
    hyps, seconds = {}, 0.0
    for batch in encoded:
        start = time.perf_counter()
        found = decode_timed(recognizer.model, batch["enc"], batch["lens"], options, biasing)
        seconds += time.perf_counter() - start
        hyps.update({u["id"]: h for u, h in zip(batch["utts"], found, strict=True)})
    return hyps, seconds


def says(text: str, phrase: str) -> bool:
    return f" {phrase} " in f" {text} "


def scores(
    recognizer: Recognizer,
    sets: dict[str, list[dict]],
    hyps: dict[str, dict],
    spoken: dict[str, str],
    unsaid: list[str],
) -> dict:
    """Recall of the spoken phrases, WER per set, and hypotheses holding unsaid phrases."""
    texts = {
        name: {uid: recognizer.tokenizer.decode(h.tokens) for uid, h in hyps[name].items()}
        for name in sets
    }
    line: dict = {}
    context = texts["test-context"]
    recalled = sum(says(context[uid], phrase) for uid, phrase in spoken.items())
    line["recall"] = round(recalled / len(spoken), 4)
    for name, utterances in sets.items():
        errors = corpus_errors(
            [u["text"] for u in utterances], [texts[name][u["id"]] for u in utterances]
        )
        line[f"wer_{name}"] = round(100 * errors.wer, 2)
    line["false_phrases"] = sum(
        says(text, phrase) for name in sets for text in texts[name].values() for phrase in unsaid
    )
    return line


def word_labels(reference: str, hypothesis: str) -> list[bool]:
    """Per hypothesis word, whether the alignment with the reference matches it."""
    if not hypothesis.split():
        return []
    right = [False] * len(hypothesis.split())
    alignment = jiwer.process_words(reference, hypothesis).alignments[0]
    for chunk in alignment:
        if chunk.type == "equal":
            for i in range(chunk.hyp_start_idx, chunk.hyp_end_idx):
                right[i] = True
    return right


def roc_auc(right: list[float], wrong: list[float]) -> float:
    """P(a right word's confidence > a wrong word's), ties counting half."""
    ranked = sorted([(c, 1) for c in right] + [(c, 0) for c in wrong])
    rank_sum, i = 0.0, 0
    while i < len(ranked):  # average ranks over ties
        j = i
        while j < len(ranked) and ranked[j][0] == ranked[i][0]:
            j += 1
        average = (i + j + 1) / 2
        rank_sum += average * sum(label for _, label in ranked[i:j])
        i = j
    n_right, n_wrong = len(right), len(wrong)
    return (rank_sum - n_right * (n_right + 1) / 2) / (n_right * n_wrong)


def confidence_line(
    recognizer: Recognizer, utterances: list[dict], hyps: dict, search: str
) -> dict:
    """ROC AUC and the reliability table of word confidence against right/wrong words."""
    from asr.inference.timestamps import words_from_tokens

    pairs = []
    for u in utterances:
        hyp = hyps[u["id"]]
        pieces = [recognizer.tokenizer.id_to_piece(i) for i in hyp.tokens]
        words = words_from_tokens(pieces, [0.0] * len(pieces), 0.0, confidences=hyp.confidences)
        labels = word_labels(u["text"], " ".join(w.word for w in words))
        pairs += list(zip([w.confidence for w in words], labels, strict=True))
    right = [c for c, ok in pairs if ok]
    wrong = [c for c, ok in pairs if not ok]
    table = []
    for low, high in zip(CONFIDENCE_BINS, CONFIDENCE_BINS[1:], strict=False):
        inside = [(c, ok) for c, ok in pairs if low <= c < high or (high == 1.0 and c == 1.0)]
        if inside:
            table.append(
                {
                    "bin": f"{low:.2f}-{high:.2f}",
                    "words": len(inside),
                    "mean_confidence": round(sum(c for c, _ in inside) / len(inside), 3),
                    "accuracy": round(sum(ok for _, ok in inside) / len(inside), 3),
                }
            )
    return {
        "section": "confidence",
        "search": search,
        "words": len(pairs),
        "wrong_words": len(wrong),
        "roc_auc": round(roc_auc(right, wrong), 4),
        "reliability": table,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="bundle (asr-export)")
    parser.add_argument("--manifests", type=Path, default=Path("data/demo/manifests"))
    parser.add_argument("--scores", default="1,2,3,4,4.5,5,6")
    parser.add_argument("--beams", default="4,8", help="beam sizes besides greedy search")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--chunk-ms", type=float, default=None, help="a streaming model's chunk")
    parser.add_argument("--skip-cost", action="store_true", help="no cost lines")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    recognizer = load_recognizer(args.model)
    if args.chunk_ms is not None:
        recognizer = recognizer.with_chunking(chunking_of_ms(recognizer.model, args.chunk_ms, None))
    phrases_file = args.manifests / "context_phrases.json"
    if not phrases_file.is_file():
        raise SystemExit(
            f"{phrases_file}: not found; make the sets: asr-make-context-sets data/demo"
        )
    made = json.loads(phrases_file.read_text())
    spoken = {uid: about["phrase"] for uid, about in made["utterances"].items()}
    lists = {
        n: read_biasing_phrases(args.manifests / f"context_phrases_{n}.txt")
        for n in (10, 100, 1000)
    }
    unsaid = made["distractors"]
    sets = {
        name: set_features(recognizer, cuts_path(args.manifests, name))
        for name in ("test-context", "test-plain")
    }
    encoded = {name: encode_all(recognizer, utts, args.batch_size) for name, utts in sets.items()}
    searches: dict[str, SearchOptions] = {"greedy": GreedyOptions()}
    for beam in map(int, args.beams.split(",")):
        searches[f"beam{beam}"] = BeamOptions(beam_size=beam)
    sweep = [float(s) for s in args.scores.split(",")]
    if DEFAULT_BIASING_SCORE not in sweep:
        sweep = sorted([*sweep, DEFAULT_BIASING_SCORE])
    for search, options in searches.items():
        baseline = None
        for score in [None, *sweep]:
            graph = (
                None
                if score is None
                else BiasingGraph.from_phrases(lists[100], recognizer.tokenizer, score)
            )
            hyps = {name: search_all(recognizer, encoded[name], options, graph)[0] for name in sets}
            line = {"section": "sweep", "search": search, "phrases": 0 if score is None else 100}
            line |= {"score": score, **scores(recognizer, sets, hyps, spoken, unsaid)}
            print(json.dumps(line), flush=True)
            if score is None:
                baseline = line
            elif score == DEFAULT_BIASING_SCORE:
                missed = 1 - baseline["recall"]
                target = {
                    "section": "targets",
                    "search": search,
                    "score": score,
                    "recall": [baseline["recall"], line["recall"]],
                    "recall_gain_over_missed": round(
                        (line["recall"] - baseline["recall"]) / missed, 3
                    )
                    if missed
                    else None,
                    "plain_wer": [baseline["wer_test-plain"], line["wer_test-plain"]],
                }
                target["met"] = (target["recall_gain_over_missed"] or 0) >= 0.5 and (
                    line["wer_test-plain"] - baseline["wer_test-plain"] <= 0.3
                )
                print(json.dumps(target), flush=True)
    # Cost: the same batches, each list size in turn (search time apart from the encoder's).
    audio = sum(u["seconds"] for utts in sets.values() for u in utts)
    count = sum(len(utts) for utts in sets.values())
    encoder_s = sum(b["seconds"] for batches_ in encoded.values() for b in batches_)
    for search, options in searches.items() if not args.skip_cost else ():
        for size in (0, 10, 100, 1000):
            start = time.perf_counter()
            graph = BiasingGraph.from_phrases(lists[size], recognizer.tokenizer) if size else None
            build_s = time.perf_counter() - start
            search_s = sum(
                search_all(recognizer, encoded[name], options, graph)[1] for name in sets
            )
            print(
                json.dumps(
                    {
                        "section": "cost",
                        "search": search,
                        "phrases": size,
                        "states": graph.num_states if graph else 0,
                        "build_ms": round(1000 * build_s, 1),
                        "search_ms_per_utterance": round(1000 * search_s / count, 2),
                        "rtfx": round(audio / (encoder_s + search_s), 1),
                    }
                ),
                flush=True,
            )
    # Confidence on the plain test set of the demo corpus.
    test = set_features(recognizer, cuts_path(args.manifests, "test-clean"))
    test_encoded = encode_all(recognizer, test, args.batch_size)
    for search, options in track(list(searches.items()), description="confidence", transient=True):
        hyps, _ = search_all(recognizer, test_encoded, options, None)
        print(json.dumps(confidence_line(recognizer, test, hyps, search)), flush=True)


if __name__ == "__main__":
    main()
