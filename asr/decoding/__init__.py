"""From encoder output to token ids: every transducer search behind one contract with an
explicit progress (`search`: start / advance / best, and the factory from options; greedy
in `transducer` and `label_looping`, beam in `transducer_beam`; what each hypothesis carries
in `hypotheses`; what a token-and-duration transducer's durations mean to them in
`durations`), the attention decoder's searches (`aed`), phrases every search can boost
(`biasing`) and each token's confidence (`confidence`). `asr-decode` over a manifest lives
in `asr.inference.cli`."""
