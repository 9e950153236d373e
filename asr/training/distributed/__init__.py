"""Training on several processes, through one door: `setup.setup_distributed(config, facts)`
returns the Lightning strategy, the callbacks it needs, what `AsrLitModule` may ask of it
(`features.StrategyFeatures`, a Protocol) and what its `auto`/null keys resolved to.
`config` holds the `distributed` keys, `ddp` what every multi-process run needs (process
counts, CPU threads, `find_unused_parameters`, recognising a lost peer). Everything under
`savers/` is optional research that cuts communication, off unless a config selects it:
Deep Gradient Compression (`savers.dgc*`, a DDP communication hook), AdaScale
(`savers.adascale`), decentralized AD-PSGD / H-ADPSGD (`savers.adpsgd`, `savers.gossip`), and
a debug straggler (`savers.straggler`). Only `setup` imports them."""
