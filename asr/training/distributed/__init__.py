"""Multi-process training on torch.distributed, through Lightning strategies."""
