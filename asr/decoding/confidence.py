"""How sure a search was of each token and word, from the model's own posteriors.

A token's confidence is 1 - H(p) / log V, where p is the distribution over the V outputs
(blank included) from which the search took the token and H its Gibbs entropy: 1 when all
the probability is on one output, 0 when it is spread evenly (NeMo's entropy measure with
linear normalization). It reads the model's posteriors, never a context bonus. A word's
confidence is its least confident token's: a word is as doubtful as its most doubtful
piece. How well it separates right from wrong words on the demo: recipes/demo/RESULTS.md,
"Word confidence".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor


def token_confidence(log_probs: Tensor) -> Tensor:
    """(..., V) log-probabilities -> (...) confidences in [0, 1]."""
    log_probs = log_probs.float()
    entropy = -(log_probs.exp() * log_probs).nan_to_num().sum(dim=-1)
    return (1.0 - entropy / math.log(log_probs.size(-1))).clamp(0.0, 1.0)


def word_confidence(token_confidences: Sequence[float]) -> float:
    """A word's confidence from its tokens' (the least confident)."""
    if not token_confidences:
        raise ValueError("a word has at least one token")
    return min(token_confidences)
