"""Training under Lightning: `train` (`asr-train`) builds everything from the Hydra config;
`module` is the one LightningModule; `objective`, `optimizer` and `schedules` what it
minimizes and how; `step_guard`, `checkpointing`, `loggers` and `precision` keep a run
safe and observable; `oomptimizer` and `probes` size the batches; `distributed` runs it
on several processes."""
