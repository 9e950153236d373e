"""The communication savers, optional research behind `asr.training.distributed.setup`:
`dgc` (Deep Gradient Compression as a DDP communication hook; `dgc_state` its config and
per-rank state, `dgc_adam` AdamW with a frozen second moment, `dgc_resume` the per-rank
state beside `last.ckpt`, `dgc_monitor` its logging), `hooked_ddp` (the DDP strategy that
registers a hook on every device and carries DGC's state through checkpoints), `adascale`
(AdaScale's learning-rate gain, a hook and a callback), `adpsgd` + `gossip` (decentralized
AD-PSGD / H-ADPSGD, a Lightning strategy), `straggler` (a debug option slowing one rank)
and `hooks` (what communication hooks share)."""
