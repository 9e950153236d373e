"""What fusing a language model costs a search: time per utterance with and without an LM;
prints JSON lines.

    python scripts/benchmark_lm.py exp/demo/model.bundle.pt \\
        data/demo/manifests/librispeech_cuts_test-clean.jsonl.gz \\
        --lm exp/demo/lm/lm3.arpa exp/demo/lm/lm6.arpa --lodr exp/demo/lm/lodr2.arpa \\
        --threads 1 --beam 8 --batch-sizes 1,16

The encoder runs once per batch beforehand (not timed): what is timed is the search alone,
then each search is repeated with every LM (`--lm`, each alone and with `--lodr`), one
batch of each in turn (no LM, LM, LM, no LM, ...) so that drift in the machine's speed hits
both alike. Per line: the search, batch size and LM; `search_s` without and with it,
`search_ratio` (without / with: the share of the search's speed kept, the RTFx ratio of
the search), `whole_ratio` (the same with the encoder's time added: what a user's decode
keeps), and both WERs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from rich.progress import track

from asr.benchmarks.rtfx import add_decoding_arguments, batches, utterance_features
from asr.decoding.fusion import load_fusion
from asr.decoding.search import decode
from asr.decoding.transducer import GreedyOptions
from asr.decoding.transducer_beam import BeamOptions
from asr.inference.recognizer import load_recognizer
from asr.metrics import ErrorCounts, word_errors


@torch.inference_mode()
def encoded_batches(model, utterances: list[dict], size: int) -> list[tuple]:
    """Per batch: (encoder output, lengths, encoder seconds, its utterances)."""
    out = []
    for batch in batches(utterances, size):
        lens = torch.tensor([u["feats"].shape[0] for u in batch])
        padded = torch.nn.utils.rnn.pad_sequence([u["feats"] for u in batch], batch_first=True)
        start = time.perf_counter()
        enc, enc_lens = model.encode(padded, lens)
        out.append((enc, enc_lens, time.perf_counter() - start, batch))
    return out


def measure(recognizer, encoded: list[tuple], options, fusion, label: str) -> dict:
    """The search over `encoded` without and with `fusion`, alternating; one JSON dict."""
    model, tokenizer = recognizer.model, recognizer.tokenizer
    name = "greedy" if isinstance(options, GreedyOptions) else f"beam{options.beam_size}"
    runs = {"plain": None, "lm": fusion}
    seconds = {m: 0.0 for m in runs}
    errors = {m: ErrorCounts() for m in runs}
    for lm in runs.values():  # warm-up
        decode(model, encoded[0][0], encoded[0][1], options, None, lm)
    order = list(runs)
    for enc, lens, _, batch in track(encoded, description=f"{name} {label}", transient=True):
        order.reverse()
        for m in order:
            start = time.perf_counter()
            ids = decode(model, enc, lens, options, None, runs[m])
            seconds[m] += time.perf_counter() - start
            for u, hyp in zip(batch, ids, strict=True):
                errors[m] += word_errors(u["text"], tokenizer.decode(hyp))
    encoder_s = sum(e[2] for e in encoded)
    audio = sum(u["seconds"] for e in encoded for u in e[3])
    return {
        "search": name,
        "batch_size": encoded[0][0].size(0),
        "lm": label,
        "utterances": sum(len(e[3]) for e in encoded),
        "audio_s": round(audio, 1),
        "search_s": round(seconds["plain"], 3),
        "search_s_lm": round(seconds["lm"], 3),
        "search_ratio": round(seconds["plain"] / seconds["lm"], 3),
        "whole_ratio": round((encoder_s + seconds["plain"]) / (encoder_s + seconds["lm"]), 3),
        "search_rtfx": round(audio / seconds["plain"], 1),
        "search_rtfx_lm": round(audio / seconds["lm"], 1),
        "wer_percent": round(100 * errors["plain"].wer, 3),
        "wer_percent_lm": round(100 * errors["lm"].wer, 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bundle", type=Path, help="a transducer's bundle")
    parser.add_argument("manifest", type=Path, help="test cuts (lhotse manifest)")
    parser.add_argument("--lm", type=Path, nargs="+", required=True, help="ARPA files")
    parser.add_argument("--lm-weight", type=float, default=0.3)
    parser.add_argument("--lodr", type=Path, default=None, help="a LODR ARPA file")
    parser.add_argument("--lodr-weight", type=float, default=0.1)
    add_decoding_arguments(parser)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    recognizer = load_recognizer(args.bundle)
    tokenizer = recognizer.tokenizer
    pieces = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    fusions = {}
    for path in args.lm:
        fusions[path.name] = load_fusion(pieces, path, args.lm_weight)
        if args.lodr is not None:
            fusions[f"{path.name}+{args.lodr.name}"] = load_fusion(
                pieces, path, args.lm_weight, args.lodr, args.lodr_weight
            )
    utterances = utterance_features(recognizer, args.manifest, args.max_utterances)
    searches = [GreedyOptions()] + ([BeamOptions(beam_size=args.beam)] if args.beam > 1 else [])
    for size in (int(s) for s in args.batch_sizes.split(",")):
        encoded = encoded_batches(recognizer.model, utterances, size)
        for options in searches:
            for label, fusion in fusions.items():
                line = measure(recognizer, encoded, options, fusion, label)
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
