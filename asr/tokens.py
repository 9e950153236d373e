"""Token ids every part shares: the one place data, models and losses read them from.

Id 0 is the transducer/CTC blank and also the padding value of token tensors; BOS and EOS
start and end attention-decoder sequences. The tokenizer (`asr.data.tokenizer`) trains its
SentencePiece models with exactly these ids and refuses a model that has others.
"""

BLANK_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
PAD_ID = BLANK_ID
# Piece names of the special ids in a SentencePiece model, by id.
SPECIAL_PIECES = {BLANK_ID: "<blk>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}
# Target positions a cross-entropy loss skips (F.cross_entropy's default).
IGNORE_INDEX = -100
# SentencePiece marks a piece that starts a word with "▁": the one word-start rule that word
# timestamps and context biasing share.
WORD_START = "\u2581"


def starts_word(piece: str) -> bool:
    """Whether a SentencePiece piece starts a word."""
    return piece.startswith(WORD_START)
