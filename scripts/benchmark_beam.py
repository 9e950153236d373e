"""Greedy against beam search for a transducer: WER and decoding speed (RTFx);
prints JSON lines.

    python scripts/benchmark_beam.py exp/demo/model.bundle.pt \\
        data/demo/manifests/librispeech_cuts_test-clean.jsonl.gz [--beam 4] [--batch-sizes 1,16]

For each batch size, both searches decode the same batches, one batch of each in turn
(greedy, beam, beam, greedy, ...) so that drift in the machine's speed hits both alike;
features are computed once beforehand and not timed, the encoder is timed with each search.
Per line: the batch size, and per search its RTFx (seconds of audio / seconds of encoder +
search), the search's share of the time, its WER, and the beam's RTFx cost
(`greedy_over_beam_rtfx`) and WER change (`beam_minus_greedy_wer`). A last line sums up.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from rich.progress import track

from asr.benchmarks.rtfx import (
    add_decoding_arguments,
    batches,
    decode_batch,
    utterance_features,
)
from asr.decoding.search import SearchOptions
from asr.decoding.transducer import GreedyOptions
from asr.decoding.transducer_beam import BeamOptions
from asr.inference.recognizer import Recognizer, load_recognizer
from asr.metrics import ErrorCounts, word_errors
from asr.models.transducer import Transducer


def measure(recognizer: Recognizer, utterances: list[dict], batch_size: int, beam: int) -> dict:
    """Greedy and beam search over the same batches, alternating; one JSON-ready dict."""
    searches: dict[str, SearchOptions] = {
        "greedy": GreedyOptions(),
        f"beam{beam}": BeamOptions(beam_size=beam),
    }
    times = {name: [0.0, 0.0] for name in searches}
    errors = {name: ErrorCounts() for name in searches}
    for batch in batches(utterances[: max(batch_size, 4)], batch_size):  # warm-up
        for options in searches.values():
            decode_batch(recognizer, batch, options)
    order = list(searches)
    for batch in track(batches(utterances, batch_size), description=f"batch {batch_size}"):
        order.reverse()
        for name in order:
            enc_s, search_s, ids = decode_batch(recognizer, batch, searches[name])
            times[name][0] += enc_s
            times[name][1] += search_s
            for u, hyp in zip(batch, ids, strict=True):
                errors[name] = errors[name] + word_errors(
                    u["text"], recognizer.tokenizer.decode(hyp)
                )
    audio = sum(u["seconds"] for u in utterances)
    line: dict = {"batch_size": batch_size, "utterances": len(utterances)}
    line["audio_seconds"] = round(audio, 1)
    for name in searches:
        enc_s, search_s = times[name]
        line[name] = {
            "rtfx": round(audio / (enc_s + search_s), 1),
            "seconds": round(enc_s + search_s, 2),
            "search_fraction": round(search_s / (enc_s + search_s), 3),
            "wer": round(100 * errors[name].wer, 2),
            "errors": errors[name].errors,
            "words": errors[name].ref_words,
        }
    greedy, beamed = line["greedy"], line[f"beam{beam}"]
    line["greedy_over_beam_rtfx"] = round(greedy["rtfx"] / beamed["rtfx"], 2)
    line["beam_minus_greedy_wer"] = round(beamed["wer"] - greedy["wer"], 2)
    return line


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", type=Path, help="bundle or checkpoint of a transducer")
    parser.add_argument("manifest", type=Path, help="cut manifest with audio and transcripts")
    add_decoding_arguments(parser)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    recognizer = load_recognizer(args.model)
    if not isinstance(recognizer.model, Transducer):
        raise SystemExit(f"{args.model} is not a transducer (greedy vs beam search)")
    utterances = utterance_features(recognizer, args.manifest, args.max_utterances)
    lines = []
    for batch_size in (int(b) for b in args.batch_sizes.split(",")):
        lines.append(measure(recognizer, utterances, batch_size, args.beam))
        print(json.dumps(lines[-1]), flush=True)
    first = lines[0]
    summary = {
        "summary": True,
        "greedy_wer": first["greedy"]["wer"],
        f"beam{args.beam}_wer": first[f"beam{args.beam}"]["wer"],
        "greedy_over_beam_rtfx": {
            line["batch_size"]: line["greedy_over_beam_rtfx"] for line in lines
        },
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
