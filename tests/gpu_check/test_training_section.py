"""The check's and the bench's models never take their vocabulary from a tokenizer left in
the checkout (the demo's, under data/demo): they build random weights at a fixed size."""

from pathlib import Path

import pytest

from asr.data.tokenizer import train_tokenizer
from asr.gpu_check.train_steps import random_weights_setup
from asr.gpu_check.training import REHEARSAL_CASE
from asr.training.oomptimizer import compose_config
from asr.training.probes import ModelSetup

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while"]
WORDS += ["seven", "wizards", "quietly", "hex"]


def test_a_checkout_tokenizer_neither_changes_nor_refuses_the_vocabulary(tmp_path: Path) -> None:
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 4
    path = tmp_path / "bpe.model"
    train_tokenizer(texts, path, vocab_size=40)
    cfg = compose_config([*REHEARSAL_CASE.overrides, f"data.tokenizer={path}"])
    with pytest.raises(ValueError, match="differs from data.tokenizer"):
        ModelSetup.from_config(cfg, REHEARSAL_CASE.vocab_size)  # what asr-oomptimizer does
    setup = random_weights_setup(cfg, REHEARSAL_CASE.vocab_size)
    assert setup.vocab_size == REHEARSAL_CASE.vocab_size == 32
    assert setup.precision == "bf16-mixed"
    assert cfg.data.tokenizer == str(path)  # the caller's config is left as it was
