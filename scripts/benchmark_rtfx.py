"""Decoding speed (RTFx) of a deep and a flash attention encoder-decoder; prints JSON lines.

    python scripts/benchmark_rtfx.py exp/demo_aed_deep/model.bundle.pt \\
        exp/demo_aed_flash/model.bundle.pt data/demo/manifests/librispeech_cuts_test-clean.jsonl.gz

RTFx = seconds of audio / seconds of decoding wall time (encoder + search; features are
computed once beforehand and not timed). For each search (greedy, beam search of
`--beam`) and batch size (`--batch-sizes`), both models decode the same utterances, one
batch of each in turn (deep, flash, flash, deep, ...) so that drift in the machine's speed
hits both alike. Batches of more than one utterance group utterances of similar length.
Per line: parameters, RTFx, the flash/deep RTFx ratio, the fractions of time in the
encoder and in the decoder, the encoder's milliseconds per second of audio, the search's
milliseconds per emitted token, each model's WER on these utterances, and
`flash_over_deep_decoder_only`: the ratio of search times alone, the ceiling of the RTFx
ratio if the encoders cost nothing.
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
from asr.decoding.aed import AedSearchOptions
from asr.inference.recognizer import Recognizer, load_recognizer
from asr.metrics import ErrorCounts, word_errors
from asr.models.aed import EncoderDecoder
from asr.models.build import count_parameters


def measure(
    models: dict[str, Recognizer],
    utterances: list[dict],
    batch_size: int,
    options: AedSearchOptions,
) -> dict:
    """Both models over the same batches, alternating; one JSON-ready dict."""
    times = {name: [0.0, 0.0] for name in models}
    tokens = dict.fromkeys(models, 0)
    errors = {name: ErrorCounts() for name in models}
    for batch in batches(utterances[: max(batch_size, 4)], batch_size):  # warm-up
        for recognizer in models.values():
            decode_batch(recognizer, batch, options)
    search = "greedy" if options.beam_size == 1 else f"beam{options.beam_size}"
    order = list(models)
    for batch in track(batches(utterances, batch_size), description=f"{search} x{batch_size}"):
        order.reverse()  # deep first, then flash first, ...
        for name in order:
            enc_s, dec_s, ids = decode_batch(models[name], batch, options)
            times[name][0] += enc_s
            times[name][1] += dec_s
            tokens[name] += sum(len(i) for i in ids)
            for u, hyp in zip(batch, ids, strict=True):
                text = models[name].tokenizer.decode(hyp)
                errors[name] = errors[name] + word_errors(u["text"], text)
    audio = sum(u["seconds"] for u in utterances)
    line: dict = {"search": search, "batch_size": batch_size, "utterances": len(utterances)}
    line["audio_seconds"] = round(audio, 1)
    for name, recognizer in models.items():
        enc_s, dec_s = times[name]
        line[name] = {
            "parameters": count_parameters(recognizer.model),
            "encoder_layers": len(recognizer.model.encoder.layers),
            "decoder_layers": len(recognizer.model.decoder.layers),
            "rtfx": round(audio / (enc_s + dec_s), 1),
            "seconds": round(enc_s + dec_s, 2),
            "encoder_fraction": round(enc_s / (enc_s + dec_s), 3),
            "decoder_fraction": round(dec_s / (enc_s + dec_s), 3),
            "encoder_ms_per_audio_second": round(1000 * enc_s / audio, 3),
            "decoder_ms_per_token": round(1000 * dec_s / max(tokens[name], 1), 3),
            "tokens": tokens[name],
            "wer": round(100 * errors[name].wer, 2),
        }
    line["flash_over_deep"] = round(line["flash"]["rtfx"] / line["deep"]["rtfx"], 2)
    # The ratio's ceiling: what it would be if both encoders cost nothing.
    line["flash_over_deep_decoder_only"] = round(times["deep"][1] / times["flash"][1], 2)
    return line


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("deep", type=Path, help="bundle or checkpoint of the deep-decoder model")
    parser.add_argument("flash", type=Path, help="bundle or checkpoint of the flash model")
    parser.add_argument("manifest", type=Path, help="cut manifest with audio and transcripts")
    add_decoding_arguments(parser)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    models = {"deep": load_recognizer(args.deep), "flash": load_recognizer(args.flash)}
    for name, recognizer in models.items():
        if not isinstance(recognizer.model, EncoderDecoder):
            raise SystemExit(
                f"{name} model {getattr(args, name)} is not an attention encoder-decoder"
            )
    if models["deep"].features != models["flash"].features:
        raise SystemExit(
            "the two models were trained on different features; compare like with like"
        )
    utterances = utterance_features(models["deep"], args.manifest, args.max_utterances)
    for beam in (1, args.beam):
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            options = AedSearchOptions(beam_size=beam)
            print(json.dumps(measure(models, utterances, batch_size, options)), flush=True)


if __name__ == "__main__":
    main()
