"""What DDP communication hooks share."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, get_type_hints

Hook = TypeVar("Hook", bound=Callable)


def comm_hook(hook: Hook) -> Hook:
    """Mark `hook` as a DDP communication hook: DDP checks its annotations as objects
    (`dist.GradBucket`, `Future[Tensor]`), which PEP 563 leaves as strings; resolve them."""
    hook.__annotations__ = get_type_hints(hook)
    return hook
