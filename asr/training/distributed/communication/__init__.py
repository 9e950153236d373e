"""What changes how the ranks communicate: optional research behind
`asr.training.distributed.setup` (the guide's "communication savers", docs/savers.md).

Deep Gradient Compression: the package `dgc`, a module per concept: `dgc.hook` (one step
of compression and exchange), `dgc.adam` (AdamW with a frozen second moment), `dgc.state`
(its keys, what it keeps between steps, moved when DDP rebuilds its buckets and saved beside
`last.ckpt`) and `dgc.traffic` (the bytes of a step and the callback that logs them).
`hooked_ddp` is the DDP strategy that registers a hook on every device and carries DGC's
state through checkpoints; `hooks` what communication hooks share. `adascale`: AdaScale's
learning-rate gain (a hook and a callback). `adpsgd` + `gossip`: decentralized AD-PSGD /
H-ADPSGD, a Lightning strategy. `straggler`: a debug option slowing one rank.
`allreduce_wait`: a debug measurement, DDP's own all-reduce timed (how long each rank waits
for the others)."""
