"""The first command of each shell block of README.md and docs/, and every recipe line, runs for
a new user: in a clean environment (no activated venv), from the repository root, activated only
where the page has said so above it. Commands are made safe and quick: `make -n`, `--help` for
any program but the recipes. A recipe line runs as typed where that is cheap: from its train
stage (`--stage train`), the recipe runs that stage for real with `--cfg job` after the
overrides, so asr-train prints the config it would train with (every line of the recipe up to
it runs too); any other recipe line runs with `--dry-run`. Nothing is written."""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHELL_BLOCKS = {"bash", "sh", "shell", "console"}
ACTIVATIONS = (". .venv/bin/activate", "source .venv/bin/activate")
ACTIVATE = ". .venv/bin/activate && "
CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"
# Programs that are neither the project's nor on every machine: their lines are skipped.
EXTERNAL = {
    "docker": "a container runtime, not part of the project",
    "nvidia-smi": "NVIDIA's driver tool, on GPU machines only",
    "sbatch": "SLURM's job submission, on clusters only",
    "srun": "SLURM's job launcher, on clusters only",
}
PYTHONS = {"python", "python3", "python3.11"}
# The recipes whose train stage runs as typed (only its asr-train, with `--cfg job` added).
CHEAP_TRAIN_STAGE = {"recipes/demo/run.sh": "train", "recipes/librispeech/run.sh": "train"}
RUN_AS_IS = {".", "source", "cd", "export"}
ASSIGNMENTS = re.compile(r"""^(?:[A-Za-z_]\w*=(?:'[^']*'|"[^"]*"|[^\s'"])*\s+)*""")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")


@dataclass(frozen=True)
class DocCommand:
    """One block's first command line: where it is, as written, and as run."""

    where: str  # file:line
    written: str
    run: str
    skip: str = ""  # why it is not run
    error: str = ""  # why it cannot be run


def split_commands(line: str) -> list[str]:
    """The commands of a shell line joined by `&&`, `||` or `;`, without a trailing comment,
    a trailing `&` or anything after a pipe."""
    parts, current, quote, i = [], "", "", 0
    while i < len(line):
        c = line[i]
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (not current or current[-1].isspace()):
            break
        elif line.startswith(("&&", "||"), i) or c == ";" or _background(line, i):
            parts.append(current)
            current, i = "", i + (2 if line.startswith(("&&", "||"), i) else 1)
            continue
        elif c == "|":
            break
        current += c
        i += 1
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _background(line: str, i: int) -> bool:
    """Whether line[i] is a lone `&` that sends a command to the background (not `&&`, `>&`,
    `&>`)."""
    around = line[i - 1 : i] + line[i + 1 : i + 2]
    return line[i] == "&" and not any(c in around for c in "&<>")


def transform(command: str) -> str:
    """The safe, quick form of one command (see the module's docstring); raises
    `LookupError` with the reason for a program that is skipped."""
    env = ASSIGNMENTS.match(command).group(0)
    rest = command[len(env) :]
    words = shlex.split(rest)
    if not words or words[0] in RUN_AS_IS:
        return command
    head = words[0]
    if head in EXTERNAL:
        raise LookupError(f"{head}: {EXTERNAL[head]}")
    if head == "make":
        return f"{env}make -n{rest[len('make') :]}"
    script = words[1] if head in {"bash", "sh"} and len(words) > 1 else head
    if is_recipe(script):
        return env + recipe_run(script.removeprefix("./"), words)
    if head in PYTHONS and len(words) > 2 and words[1] == "-m":
        return f"{env}{head} -m {words[2]} --help"
    if head in PYTHONS | {"bash", "sh"} and len(words) > 1 and not words[1].startswith("-"):
        return f"{env}{head} {shlex.quote(words[1])} --help"
    return f"{env}{shlex.quote(head)} --help"


def is_recipe(word: str) -> bool:
    return word.removeprefix("./").startswith("recipes/") and word.endswith(".sh")


def recipe_run(script: str, words: list[str]) -> str:
    """A recipe's command line `words` as the test runs it: from the train stage as typed,
    with `--stop-stage` there and `--cfg job` after the overrides; else with `--dry-run`."""
    at = words.index("--") if "--" in words else len(words)
    options, overrides = words[:at], words[at:]
    stage = options[options.index("--stage") + 1] if "--stage" in options[:-1] else None
    cheap = stage is not None and stage == CHEAP_TRAIN_STAGE.get(script)
    if cheap and "--stop-stage" not in options and "--dry-run" not in options:
        return shlex.join([*options, "--stop-stage", stage, *(overrides or ["--"]), "--cfg", "job"])
    return shlex.join([*options, "--dry-run", *overrides])


def shell_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, command) of each shell block's first command line and of every later
    one that runs a recipe: blank and comment lines skipped, continuations joined; in
    `console` blocks only the `$ ` lines."""
    lines, fence, block, number, found = text.splitlines(), "", "", 0, False
    while number < len(lines):
        line, number = lines[number], number + 1
        opening = FENCE.match(line)
        if not fence:
            fence, block = (opening.group(1), opening.group(2).lower()) if opening else ("", "")
            found = False
            continue
        if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
            fence = ""
            continue
        if block == "console":
            line = line.strip()[2:] if line.strip().startswith("$ ") else ""
        if block not in SHELL_BLOCKS or not line.strip() or line.lstrip()[0] == "#":
            continue
        start = number
        while line.rstrip().endswith("\\") and number < len(lines):
            line, number = line.rstrip()[:-1].rstrip() + " " + lines[number].strip(), number + 1
        if found and not _runs_recipe(line):
            continue
        found = True
        yield start, line.strip()


def _runs_recipe(line: str) -> bool:
    """Whether a shell line runs a recipe script (`recipes/x/run.sh`, `bash recipes/...`)."""
    env = ASSIGNMENTS.match(line.strip()).group(0)
    words = line.strip()[len(env) :].split()
    return any(is_recipe(w) for w in words[:2])


def page_commands(text: str, name: str) -> Iterator[DocCommand]:
    """The commands of one page, activated where the page has activated .venv above them."""
    lines = text.splitlines()
    for number, line in shell_lines(text):
        above = "\n".join(lines[: number - 1])
        prefix = ACTIVATE if any(a in above for a in ACTIVATIONS) else ""
        where = f"{name}:{number}"
        try:
            run = prefix + " && ".join(transform(c) for c in split_commands(line))
        except LookupError as skipped:
            yield DocCommand(where, line, "", skip=str(skipped))
        except ValueError as error:  # shlex: unbalanced quotes
            yield DocCommand(where, line, "", error=f"not a shell line: {error}")
        else:
            yield DocCommand(where, line, run)


def doc_commands() -> list[DocCommand]:
    """Every page's commands, each distinct command once (where it first appears)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    seen, found = set(), []
    for page in (p for p in pages if p.is_file()):
        for command in page_commands(page.read_text(), str(page.relative_to(ROOT))):
            key = command.run or command.written
            if key not in seen:
                seen.add(key)
                found.append(command)
    return found


def _paths(folder: Path, depth: int) -> Iterator[str]:
    """The paths under `folder`, `depth` levels down, but for hidden ones and caches."""
    for path in folder.iterdir():
        if not path.name.startswith((".", "__pycache__")):
            yield str(path.relative_to(ROOT))
            if depth > 1 and path.is_dir():
                yield from _paths(path, depth - 1)


def _snapshot() -> set[str]:
    """The repository's untracked and changed files (git status) and its paths up to three
    levels deep, ignored ones included (exp/, data/, outputs/, ...)."""
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        capture_output=True, text=True, cwd=ROOT, check=True,
    ).stdout.splitlines()  # fmt: skip
    return set(status) | set(_paths(ROOT, 3))


@pytest.fixture(scope="module")
def repository_untouched() -> Iterator[None]:
    """An error at the end of the module if the commands left a file in the repository."""
    before = _snapshot()
    yield
    # the pages themselves may be edited meanwhile (they are not the commands' doing)
    new = sorted(p for p in _snapshot() - before if not re.search(r"(README|docs/.*)\.md$", p))
    assert not new, f"the documented commands wrote into the repository: {new[:20]}"


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize(
    "command", doc_commands(), ids=lambda c: f"{c.where}:{c.run or c.written}"[:80]
)
def test_documented_command_runs(
    command: DocCommand, repository_untouched: None, tmp_path: Path
) -> None:
    if command.skip:
        pytest.skip(command.skip)
    assert not command.error, f"{command.where}: {command.written}: {command.error}"
    if not (ROOT / ".venv" / "bin" / "asr-train").is_file():
        pytest.skip("the documented commands need the project's .venv: make install")
    environment = [f"HOME={tmp_path}", f"PATH={CLEAN_PATH}", "LANG=C.UTF-8"]
    done = subprocess.run(
        ["env", "-i", *environment, "bash", "-c", command.run],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    shown = (
        f"{command.where}: {command.written}\nran: {command.run}\nexit {done.returncode}\n"
        f"stdout: {done.stdout[-1500:]}\nstderr: {done.stderr[-1500:]}"
    )
    assert done.returncode == 0, shown
    assert "command not found" not in done.stderr, shown


def test_first_lines_of_blocks_and_recipe_lines() -> None:
    page = "\n".join([
        "```python", "import asr", "```",
        "```bash", "", "# a comment", "FOO=1 asr-train a=b \\", "    c=d &   # in the back",
        "asr-decode x \\", "  recipes/demo/run.sh", "X=1 recipes/demo/run.sh --stage 2 \\",
        "  -- a=b", "```",
        "```console", "output", "$ # a comment", "  $ make demo", "$ make test", "```",
        "```text", "make test", "```",
    ])  # fmt: skip
    assert list(shell_lines(page)) == [(7, "FOO=1 asr-train a=b c=d &   # in the back"),
                                       (11, "X=1 recipes/demo/run.sh --stage 2 -- a=b"),
                                       (17, "make demo")]  # fmt: skip
    assert split_commands("FOO=1 asr-train a=b c=d &   # in the back") == [
        "FOO=1 asr-train a=b c=d"
    ]
    assert split_commands("a 2>&1 & b &>x && . .venv/bin/activate; echo '#a|b' | head") == [
        "a 2>&1",
        "b &>x",
        ". .venv/bin/activate",
        "echo '#a|b'",
    ]


@pytest.mark.parametrize(
    ("written", "run"),
    [
        ("make demo", "make -n demo"),
        ("make -C . test", "make -n -C . test"),
        ("recipes/demo/run.sh", "recipes/demo/run.sh --dry-run"),
        (
            "EXPERIMENT=x recipes/demo/run.sh --stage train -- a=1",
            "EXPERIMENT=x recipes/demo/run.sh --stage train --stop-stage train -- a=1 --cfg job",
        ),
        (
            "recipes/librispeech/run.sh --stage train",
            "recipes/librispeech/run.sh --stage train --stop-stage train -- --cfg job",
        ),
        (
            "recipes/demo/run.sh --stage 6 -- a=1",
            "recipes/demo/run.sh --stage 6 --dry-run -- a=1",
        ),
        (
            "recipes/demo/run.sh --stage train --stop-stage decode",
            "recipes/demo/run.sh --stage train --stop-stage decode --dry-run",
        ),
        ("bash recipes/demo/ssl.sh --stage 2", "bash recipes/demo/ssl.sh --stage 2 --dry-run"),
        ("asr-train experiment=demo trainer.devices=2", "asr-train --help"),
        ("MASTER_PORT=1 NODE_RANK=0 asr-train x=1", "MASTER_PORT=1 NODE_RANK=0 asr-train --help"),
        (
            "python -m asr.training.config_files --check",
            "python -m asr.training.config_files --help",
        ),
        ("python scripts/gpu_check.py --only lattice", "python scripts/gpu_check.py --help"),
        ("torchrun --nproc-per-node 2 $(which asr-train) x=1", "torchrun --help"),
        ("bash scripts/gpu_check.sh --system-python w", "bash scripts/gpu_check.sh --help"),
        ("cd recipes", "cd recipes"),
        (". .venv/bin/activate", ". .venv/bin/activate"),
    ],
)
def test_commands_made_safe(written: str, run: str) -> None:
    assert transform(written) == run


def test_external_programs_skipped_and_activation_followed() -> None:
    with pytest.raises(LookupError, match="docker: a container runtime"):
        transform("docker run --gpus all image")
    page = "\n".join([
        "```bash", "asr-train a=1", "nvidia-smi", "```",
        "Then `source .venv/bin/activate`:",
        "```bash", "asr-decode x", "```",
        "```sh", "nvidia-smi -L", "```",
        "```bash", "asr-train b=2   # the same as above, once activated", "```",
        "```shell", "echo 'unclosed", "```",
    ])  # fmt: skip
    assert list(page_commands(page, "page.md")) == [
        DocCommand("page.md:2", "asr-train a=1", "asr-train --help"),
        DocCommand("page.md:7", "asr-decode x", f"{ACTIVATE}asr-decode --help"),
        DocCommand("page.md:10", "nvidia-smi -L", "", skip=f"nvidia-smi: {EXTERNAL['nvidia-smi']}"),
        DocCommand("page.md:13", "asr-train b=2   # the same as above, once activated",
                   f"{ACTIVATE}asr-train --help"),
        DocCommand("page.md:16", "echo 'unclosed", "",
                   error="not a shell line: No closing quotation"),
    ]  # fmt: skip
