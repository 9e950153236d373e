"""From encoder output to token ids: greedy and beam search for each model kind
(`search.decode` picks one), phrases every search can boost (`biasing`) and each token's
confidence (`confidence`). `asr-decode` over a manifest lives in `asr.inference.cli`."""
