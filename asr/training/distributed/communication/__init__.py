"""What changes how the ranks communicate: optional research behind
`asr.training.distributed.setup` (the guide's "communication savers", docs/savers.md).

Deep Gradient Compression: `dgc` (the DDP communication hook and its two exchanges),
`dgc_config` (its keys), `dgc_traffic` (the bytes of a step), `dgc_layout` (a bucket's
parameters), `dgc_state` (the per-rank state), `dgc_rebucketing` (that state moved when DDP
rebuilds its buckets), `dgc_checkpoint` (that state beside `last.ckpt`), `dgc_monitor` (the
callback that logs the traffic) and `dgc_adam` (AdamW with a frozen second moment).
`hooked_ddp` is the DDP strategy that registers a hook on every device and carries DGC's
state through checkpoints; `hooks` what communication hooks share. `adascale`: AdaScale's
learning-rate gain (a hook and a callback). `adpsgd` + `gossip`: decentralized AD-PSGD /
H-ADPSGD, a Lightning strategy. `straggler`: a debug option slowing one rank."""
