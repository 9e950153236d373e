"""What runs after training. `bundle` turns a run's checkpoints (one, or the average of
several epochs: `--epoch/--avg`, `--best`, `--ema`) into one self-contained bundle file and
rebuilds the model from it; it also names the checkpoint files, which training imports from
there. `recognizer` holds the `Recognizer` (audio -> text) that `asr.load_model` returns.
`cli` is the command lines: `asr-export`, `asr-transcribe` and `asr-decode` (a manifest ->
hyps.jsonl and WER). Inference imports models, decoding and data's tokenizer and features,
never training; training imports only `bundle` from here."""
