"""The part of the ONNX export that needs no exporter: the token table that replaces the
SentencePiece model (the normalization inside an encoder graph: tests/test_normalization.py)."""

from __future__ import annotations

from asr.inference.onnx_export import tokens_txt
from asr.inference.onnx_runtime import TokenTable


def test_tokens_txt_decodes_as_the_tokenizer_does(tokenizer, tiny_corpus, tmp_path) -> None:
    path = tmp_path / "tokens.txt"
    path.write_text(tokens_txt(tokenizer))
    lines = path.read_text().splitlines()
    assert lines[:4] == ["<blk> 0", "<unk> 1", "<s> 2", "</s> 3"]
    assert len(lines) == tokenizer.vocab_size
    table = TokenTable(path)
    texts = list(tiny_corpus.transcripts("test-clean").values())
    assert texts
    for text in texts:
        ids = tokenizer.encode(text)
        assert table.decode(ids) == tokenizer.decode(ids) == text
