"""The communication savers, optional research behind `asr.training.distributed.setup`:
`dgc` (Deep Gradient Compression as a DDP communication hook and its two exchanges;
`dgc_state` its config, per-rank state, that state beside `last.ckpt` and its logging;
`dgc_adam` AdamW with a frozen second moment), `hooked_ddp` (the DDP strategy that
registers a hook on every device and carries DGC's state through checkpoints), `adascale`
(AdaScale's learning-rate gain, a hook and a callback), `adpsgd` + `gossip` (decentralized
AD-PSGD / H-ADPSGD, a Lightning strategy), `straggler` (a debug option slowing one rank)
and `hooks` (what communication hooks share)."""
