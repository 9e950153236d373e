"""Error messages shortened to one line, for logs, skip counts and the command line, and
the one error class of a run that stops on purpose."""

from __future__ import annotations


class InputFault(RuntimeError):
    """A fault in what the user gave (data, settings) found while running, on which a
    program stops on purpose (e.g. too many unreadable cuts, a diverging loss); the message
    says what happened and what to do. Console scripts end on it as on a bad file or value
    (`asr.cli.command`): one line, exit status 1."""


def first_line(err: BaseException, *, with_type: bool = True) -> str:
    """The first line of `err`'s message (lhotse appends the whole cut to its errors, CUDA
    a page of advice), after `Type: ` unless `with_type` is false; the type name alone
    when the message is empty."""
    text = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
    lines = str(text).splitlines()
    line = lines[0].strip() if lines else ""
    if not with_type:
        return line or type(err).__name__
    return f"{type(err).__name__}: {line}"


def joined_lines(err: BaseException) -> str:
    """All of `err`'s message on one line (a KeyError's without its quotes)."""
    text = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return " ".join(lines) or type(err).__name__
