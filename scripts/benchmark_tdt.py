"""Decoding speed of a token-and-duration transducer (TDT) against a plain transducer on the
same test set; prints JSON lines.

    python scripts/benchmark_tdt.py exp/demo/model.bundle.pt exp/demo_tdt/model.bundle.pt \\
        data/demo/manifests/librispeech_cuts_test-clean.jsonl.gz --threads 1

For each search (greedy, beam search of `--beam`) and batch size (`--batch-sizes`), both
models decode the same utterances, one batch of each in turn (plain, TDT, TDT, plain, ...)
so that drift in the machine's speed hits both alike; features are computed once
beforehand and not timed. Per line: the encoder's and the search's seconds of each model,
`search_ratio` (TDT search / plain search: the TDT's saving where it acts),
`whole_speedup` (plain encoder + search over the TDT's: what a user's decode gains, the
encoders being the same size), each model's RTFx and WER on these utterances, and
`visited_share`: the frames the TDT's search ran the joiner at, over the encoder frames
(1 for a plain transducer).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from rich.progress import track

from asr.benchmarks.rtfx import add_decoding_arguments, batches, decode_batch, utterance_features
from asr.decoding.search import search_whole, transducer_search
from asr.decoding.transducer import GreedyOptions
from asr.decoding.transducer_beam import BeamOptions
from asr.inference.recognizer import Recognizer, load_recognizer
from asr.metrics import ErrorCounts, word_errors

MODELS = ("plain", "tdt")


@torch.inference_mode()
def visited_share(recognizer: Recognizer, utterances: list[dict], options, size: int) -> float:
    """Frames the search ran the joiner at / encoder frames, over `utterances`."""
    model = recognizer.model
    search = transducer_search(options, "cpu")
    visited = frames = 0
    for batch in batches(utterances, size):
        lens = torch.tensor([u["feats"].shape[0] for u in batch])
        padded = torch.nn.utils.rnn.pad_sequence([u["feats"] for u in batch], batch_first=True)
        enc, enc_lens = model.encode(padded, lens)
        progress = search_whole(search, model, enc, enc_lens)
        visited += sum(progress.visited)
        frames += int(enc_lens.sum())
    return visited / frames


def measure(
    models: dict[str, Recognizer], features: dict[str, list[dict]], size: int, options
) -> dict:
    """Both models over the same batches, alternating; one JSON-ready dict."""
    name = "greedy" if isinstance(options, GreedyOptions) else f"beam{options.beam_size}"
    seconds = {m: [0.0, 0.0] for m in models}
    errors = {m: ErrorCounts() for m in models}
    for m in models:  # warm-up
        for batch in batches(features[m][: max(size, 4)], size):
            decode_batch(models[m], batch, options)
    order = list(models)
    plain_batches = batches(features["plain"], size)
    tdt_batches = batches(features["tdt"], size)
    for plain, tdt in track(list(zip(plain_batches, tdt_batches, strict=True)), description=name):
        order.reverse()
        for m in order:
            batch = plain if m == "plain" else tdt
            enc_s, search_s, ids = decode_batch(models[m], batch, options)
            seconds[m][0] += enc_s
            seconds[m][1] += search_s
            for u, hyp in zip(batch, ids, strict=True):
                errors[m] += word_errors(u["text"], models[m].tokenizer.decode(hyp))
    audio = sum(u["seconds"] for u in features["plain"])
    line = {"search": name, "batch_size": size, "utterances": len(features["plain"])}
    for m in models:
        enc_s, search_s = seconds[m]
        line |= {
            f"{m}_encoder_s": round(enc_s, 3),
            f"{m}_search_s": round(search_s, 3),
            f"{m}_rtfx": round(audio / (enc_s + search_s), 1),
            f"{m}_wer_percent": round(100 * errors[m].wer, 2),
        }
    line["search_ratio"] = round(seconds["tdt"][1] / seconds["plain"][1], 3)
    line["whole_speedup"] = round(sum(seconds["plain"]) / sum(seconds["tdt"]), 3)
    line["visited_share"] = round(visited_share(models["tdt"], features["tdt"], options, size), 3)
    return line


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("plain", type=Path, help="a plain transducer's bundle (make demo's)")
    parser.add_argument("tdt", type=Path, help="a TDT's bundle (experiment=demo_tdt)")
    parser.add_argument("manifest", type=Path, help="test cuts (lhotse manifest)")
    add_decoding_arguments(parser)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    models = {"plain": load_recognizer(args.plain), "tdt": load_recognizer(args.tdt)}
    if models["tdt"].model.durations is None or models["plain"].model.durations is not None:
        parser.error(f"{args.tdt} must be a TDT and {args.plain} a plain transducer")
    features = {
        m: utterance_features(r, args.manifest, args.max_utterances) for m, r in models.items()
    }
    searches = [GreedyOptions()] + ([BeamOptions(beam_size=args.beam)] if args.beam > 1 else [])
    for options in searches:
        for size in (int(s) for s in args.batch_sizes.split(",")):
            print(json.dumps(measure(models, features, size, options)), flush=True)


if __name__ == "__main__":
    main()
