"""How every console script ends on bad input: one line on stderr that names the file,
key or value at fault, exit status 1, and no traceback (``ASR_DEBUG=1`` shows it).

Only errors about the user's input are shortened this way (a missing or unreadable file,
a bad value or key, and a run's own stop for a fault in its data or settings,
`asr.errors.InputFault`); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from asr.errors import InputFault, joined_lines

# OSError covers missing, unreadable and truncated files; ValueError and KeyError bad
# values and config keys; InputFault a run's own stops (asr-train's fault limits).
INPUT_ERRORS = (OSError, ValueError, KeyError, InputFault)
DEBUG_ENV = "ASR_DEBUG"

Main = TypeVar("Main", bound=Callable[..., None])


def command(main: Main) -> Main:
    """Wrap a console script's ``main(argv)`` (or a Hydra task function) with the error
    convention above."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except INPUT_ERRORS as err:
            if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
                raise
            prog = Path(sys.argv[0]).name or "asr"
            print(f"{prog}: error: {joined_lines(err)}", file=sys.stderr)
            raise SystemExit(1) from None

    return wrapper  # type: ignore[return-value]
