"""From corpus to mini-batch: manifests, tokenizer, features, bucketing and the dataset.

Follow one utterance: `corpus` reads it into a lhotse cut (`cut_text` is its transcript),
`features` stores its filterbank, `bins` and `buckets` choose its batch, `rank_sync`
splits batches across data-parallel ranks, `dataset` turns a batch of cuts into a
`batch.Batch`, and `datamodule` wires these together for Lightning. Imports no model.
"""
