"""SentencePiece tokenizer: training on transcripts, encoding and decoding.

Models are trained with the special ids of `asr.tokens` (blank 0, unk 1, BOS 2, EOS 3);
a SentencePiece model with other ids is refused.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from asr.cli import command
from asr.tokens import BLANK_ID, BOS_ID, EOS_ID, SPECIAL_PIECES, UNK_ID

log = logging.getLogger(__name__)


class Tokenizer:
    """A trained SentencePiece model with the project's special ids.

    Build it with `train_tokenizer` or `Tokenizer.load(path)`; `Tokenizer.from_bytes`
    rebuilds one from a serialized model (used by export bundles).
    """

    def __init__(self, processor: spm.SentencePieceProcessor) -> None:
        self._sp = processor
        for idx, piece in SPECIAL_PIECES.items():
            if processor.id_to_piece(idx) != piece:
                raise ValueError(
                    f"tokenizer model has {processor.id_to_piece(idx)!r} at id {idx}, "
                    f"expected {piece!r}: train it with asr.data.tokenizer.train_tokenizer"
                )

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Load a `.model` file written by `train_tokenizer`."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"tokenizer model not found: {path} (it is made by the 'tokenizer' stage: "
                "asr-train-tokenizer --cuts ... --output ..., or recipes/*/run.sh --stage "
                "tokenizer)"
            )
        return cls(spm.SentencePieceProcessor(model_file=str(path)))

    @classmethod
    def from_bytes(cls, model: bytes) -> Tokenizer:
        """Rebuild from `to_bytes()` output."""
        return cls(spm.SentencePieceProcessor(model_proto=model))

    def to_bytes(self) -> bytes:
        """The serialized SentencePiece model (self-contained)."""
        return self._sp.serialized_model_proto()

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no BOS/EOS). Unknown characters map to `UNK_ID`."""
        return self._sp.encode(text, out_type=int)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; special ids are dropped."""
        return self._sp.decode([int(i) for i in ids if int(i) > EOS_ID])

    def id_to_piece(self, idx: int) -> str:
        return self._sp.id_to_piece(idx)

    def piece_to_id(self, piece: str) -> int | None:
        """The id of a piece, or None when the vocabulary has no such piece."""
        idx = self._sp.piece_to_id(piece)
        return None if idx == UNK_ID and piece != self._sp.id_to_piece(UNK_ID) else idx


def train_tokenizer(
    texts: Iterable[str],
    model_path: str | Path,
    *,
    vocab_size: int = 128,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
) -> Tokenizer:
    """Train a SentencePiece model on `texts` and write it to `model_path` (`.model`).

    `model_type` is "bpe" or "unigram". The special ids are `BLANK_ID`, `UNK_ID`,
    `BOS_ID`, `EOS_ID` (0..3); ordinary pieces start at 4.
    """
    if model_type not in ("bpe", "unigram"):
        raise ValueError(f"tokenizer model_type must be 'bpe' or 'unigram', got {model_type!r}")
    sentences = [t.strip() for t in texts if t and t.strip()]
    if not sentences:
        raise ValueError("cannot train a tokenizer on zero non-empty transcripts")
    model_path = Path(model_path)
    model_path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=buffer,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        pad_id=BLANK_ID,
        pad_piece=SPECIAL_PIECES[BLANK_ID],
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        input_sentence_size=2_000_000,
        shuffle_input_sentence=True,
        num_threads=2,
        minloglevel=2,
    )
    tmp = model_path.with_suffix(model_path.suffix + ".tmp")
    tmp.write_bytes(buffer.getvalue())
    tmp.replace(model_path)
    log.info("wrote tokenizer %s (%s, %d pieces)", model_path, model_type, vocab_size)
    return Tokenizer.from_bytes(buffer.getvalue())


@command
def main(argv: list[str] | None = None) -> None:
    """`asr-train-tokenizer --cuts CUTS.jsonl.gz --vocab-size N --output M.model`."""
    import argparse

    from asr.data.corpus import cut_text, load_cuts

    parser = argparse.ArgumentParser(description="Train a SentencePiece tokenizer on transcripts.")
    parser.add_argument(
        "--cuts", type=Path, nargs="+", required=True, help="training cut manifests"
    )
    parser.add_argument("--vocab-size", type=int, default=128)
    parser.add_argument("--model-type", choices=("bpe", "unigram"), default="bpe")
    parser.add_argument("--output", type=Path, required=True, help="the .model file to write")
    args = parser.parse_args(argv)
    texts = (cut_text(cut) for path in args.cuts for cut in load_cuts(path))
    tok = train_tokenizer(
        texts, args.output, vocab_size=args.vocab_size, model_type=args.model_type
    )
    print(f"wrote {args.output}: {args.model_type}, {tok.vocab_size} pieces")


if __name__ == "__main__":
    main()
