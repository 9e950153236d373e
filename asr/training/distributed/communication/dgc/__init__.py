"""Deep Gradient Compression (Lin et al., ICLR 2018, arXiv 1712.01887): one DDP
communication hook, in a module per concept.

- `hook`: one step of compression and exchange: each bucket's gradient folded into its
  residual, the top-k sent, the all-gather or reduce-scatter exchange, and an AdamW run's
  dense steps (`dgc_hook`).
- `adam`: AdamW under the hook: a frozen second moment, each rank's clamped direction and
  the second moment's refreshes (the optimizer the hook takes over).
- `state`: what the hook is configured with and keeps between steps (`DGCConfig`,
  `DGCState`), where each parameter lies in a bucket (`BucketLayout`), how that state follows
  DDP when it rebuilds its buckets, and how each rank saves and restores it beside
  `last.ckpt`.
- `traffic`: the bytes of each step (`StepTraffic`) and the callback that logs them
  (`CompressionMonitor`).

How a step works, the keys and the measured accuracy: docs/savers.md#deep-gradient-compression.
"""
