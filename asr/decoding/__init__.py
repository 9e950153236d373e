"""From encoder output to token ids: greedy and beam search for each model kind
(`search.decode` picks one). `asr-decode` over a manifest lives in `asr.inference.cli`."""
