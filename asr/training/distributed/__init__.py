"""Training on several processes, through one door: `setup.setup_distributed(config, facts)`
returns the Lightning strategy, the callbacks it needs, what `AsrLitModule` may ask of it
(`features.StrategyFeatures`, a Protocol) and what its `auto`/null keys resolved to.
`config` holds the `distributed` keys, `ddp` what every multi-process run needs (process
counts, CPU threads, `find_unused_parameters`, recognising a lost peer). Everything under
`communication/` is optional research that changes how the ranks communicate, off unless a
config selects it: Deep Gradient Compression (the package `communication.dgc`, a DDP
communication hook), AdaScale (`communication.adascale`), decentralized AD-PSGD / H-ADPSGD
(`communication.adpsgd`, `communication.gossip`), a debug straggler
(`communication.straggler`) and a debug timer of DDP's all-reduce
(`communication.allreduce_wait`). Only `setup` imports them."""
