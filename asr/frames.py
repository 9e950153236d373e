"""Audio and frame facts shared by the data pipeline and the models.

Audio is 16 kHz; features have one frame per 10 ms; the Conformer's convolutional
subsampling maps feature frames to encoder frames (`subsampled_lengths`). The data
pipeline needs the last to drop utterances with more tokens than encoder frames, without
importing any model.
"""

from __future__ import annotations

from typing import overload

from torch import SymInt, Tensor

SAMPLE_RATE = 16_000
FRAME_SHIFT_SECONDS = 0.01
FRAMES_PER_SECOND = 100


def feature_frames(num_samples: int) -> int:
    """Filterbank frames of `num_samples` samples (a 10 ms hop, frames centred on it as
    Kaldi's `snip_edges=False` places them)."""
    hop = SAMPLE_RATE // FRAMES_PER_SECOND
    return (num_samples + hop // 2) // hop


# Each stride-2 convolution of the subsampling uses kernel 3 and padding 1, so it maps n
# frames to ceil(n / 2); factor 4 uses 2 convolutions, 8 uses 3.
SUBSAMPLING_KERNEL, SUBSAMPLING_STRIDE, SUBSAMPLING_PADDING = 3, 2, 1
SUBSAMPLING_CONVS = {4: 2, 8: 3}


def conv_out_lengths(n, num_convs: int):
    """Lengths (int or tensor) after ``num_convs`` stride-2 subsampling convolutions."""
    for _ in range(num_convs):
        n = (n + 2 * SUBSAMPLING_PADDING - SUBSAMPLING_KERNEL) // SUBSAMPLING_STRIDE + 1
    return n


def num_subsampling_convs(factor: int) -> int:
    """How many stride-2 convolutions subsample by ``factor``; a clear error otherwise."""
    if factor not in SUBSAMPLING_CONVS:
        raise ValueError(
            f"subsampling factor must be one of {sorted(SUBSAMPLING_CONVS)}, got {factor!r}"
        )
    return SUBSAMPLING_CONVS[factor]


@overload
def subsampled_lengths(lens: int, factor: int) -> int: ...
@overload
def subsampled_lengths(lens: Tensor, factor: int) -> Tensor: ...
def subsampled_lengths(lens, factor):
    """Exact encoder frame counts after subsampling by ``factor``: ceil(lens / factor).

    Accepts an int or an integer tensor of any shape; 0 frames stay 0.
    """
    return conv_out_lengths(lens, num_subsampling_convs(factor))


def subsampled_length(n: int, factor: int) -> int:
    """``subsampled_lengths`` for one plain int (or a symbolic size while exporting: kept
    symbolic, so an exported encoder takes any length)."""
    if isinstance(n, SymInt):
        return subsampled_lengths(n, factor)
    return int(subsampled_lengths(int(n), factor))
