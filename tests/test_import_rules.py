"""The package's import rules (see the module docstrings and DESIGN): which parts may
import which, and no import cycle. Read from the source with `ast`, so a rule holds for
imports inside functions too."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "asr"
# (importer package, imported package) pairs that must never occur.
FORBIDDEN = [
    ("asr.data", "asr.models"),
    ("asr.models", "asr.data"),
    ("asr.losses", "asr.models"),
    ("asr.losses", "asr.data"),
    ("asr.models", "asr.losses"),
    ("asr.models", "asr.training"),
    ("asr.data", "asr.training"),
    ("asr.losses", "asr.training"),
    ("asr.decoding", "asr.training"),
    ("asr.inference", "asr.training"),
    ("asr.models", "asr.inference"),
    ("asr.data", "asr.inference"),
    ("asr.losses", "asr.inference"),
    ("asr.decoding", "asr.inference"),
]
# All that asr.inference may import; its command lines (asr-decode is an application) may
# also read and batch manifests as training does.
INFERENCE_IMPORTS = (
    "asr.inference",
    "asr.models",
    "asr.decoding",
    "asr.data.tokenizer",
    "asr.data.features",
    "asr.tokens",
    "asr.frames",
    "asr.normalization",
    "asr.cli",
    "asr.errors",
    "asr.metrics",
)
INFERENCE_CLI_IMPORTS = ("asr.data.corpus", "asr.data.buckets", "asr.data.dataset")
# The modules of asr.inference that read manifests (asr-decode): the command line and its
# library function.
DECODES_MANIFESTS = ("asr.inference.cli", "asr.inference.manifest_decoding")
# The one part of asr.inference that training may import: the bundle and checkpoint names.
TRAINING_REACHES_INFERENCE = ("asr.inference.bundle",)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Modules of `asr` that `path` imports (anywhere in the file)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("asr"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("asr"):
            found.add(node.module)
            # `from asr.demo import lexicon`: a module, not a name
            for alias in node.names:
                if (PACKAGE.parent / node.module.replace(".", "/") / f"{alias.name}.py").exists():
                    found.add(f"{node.module}.{alias.name}")
    return found


GRAPH = {module_name(p): imports_of(p) for p in sorted(PACKAGE.rglob("*.py"))}


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize(("importer", "imported"), FORBIDDEN)
def test_forbidden_import_directions(importer: str, imported: str) -> None:
    offending = sorted(
        f"{m} imports {i}"
        for m, targets in GRAPH.items()
        if within(m, importer)
        for i in targets
        if within(i, imported)
    )
    assert not offending, offending


def test_inference_imports_only_its_layers() -> None:
    offending = sorted(
        f"{m} imports {i}"
        for m, targets in GRAPH.items()
        if within(m, "asr.inference")
        for i in targets
        if not any(
            within(i, allowed)
            for allowed in INFERENCE_IMPORTS
            + (INFERENCE_CLI_IMPORTS if m in DECODES_MANIFESTS else ())
        )
    )
    assert not offending, offending


def test_training_imports_only_the_bundle_of_inference() -> None:
    offending = sorted(
        f"{m} imports {i}"
        for m, targets in GRAPH.items()
        if within(m, "asr.training")
        for i in targets
        if within(i, "asr.inference") and i not in TRAINING_REACHES_INFERENCE
    )
    assert not offending, offending


def test_nothing_in_the_package_imports_the_benchmarks() -> None:
    """asr.benchmarks holds the scripts' shared helpers: it may import any part, none it."""
    offending = sorted(
        f"{m} imports {i}"
        for m, targets in GRAPH.items()
        if not within(m, "asr.benchmarks")
        for i in targets
        if within(i, "asr.benchmarks")
    )
    assert not offending, offending


def test_no_import_cycle() -> None:
    """Depth-first search over module imports (a package's __init__ counts as a module)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(GRAPH.get(module, ())):
            if target not in GRAPH or target == module:
                continue
            if state.get(target) == 1:
                cycle = path[path.index(target) :] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in GRAPH:
        if module not in state:
            visit(module)


def test_the_rules_see_real_imports() -> None:
    """The graph is not empty by mistake: known imports are found."""
    assert "asr.frames" in GRAPH["asr.data.dataset"]
    assert "asr.tokens" in GRAPH["asr.models.aed"]
    assert "asr.demo.lexicon" in GRAPH["asr.demo.plan"]
    assert "asr.inference.bundle" in GRAPH["asr.inference.recognizer"]
    assert "asr.inference.bundle" in GRAPH["asr.training.callbacks"]
    assert "asr.data.corpus" in GRAPH["asr.inference.manifest_decoding"]


COMMUNICATION = "asr.training.distributed.communication"
# The modules that may import the optional communication package: the door, the config that
# types their keys, the generator that writes their YAML from it, and the GPU check (which
# reads DGC's per-rank state files).
COMMUNICATION_DOORS = {
    "asr.training.distributed.setup",
    "asr.training.distributed.config",
    "asr.training.config_files",
    "asr.gpu_check.ddp",
}


def test_the_communication_package_enters_through_one_door() -> None:
    offending = sorted(
        f"{m} imports {i}"
        for m, targets in GRAPH.items()
        if not within(m, COMMUNICATION) and m not in COMMUNICATION_DOORS
        for i in targets
        if within(i, COMMUNICATION)
    )
    assert not offending, offending


MAX_MODULE_LINES = 800  # one concept per module; the limit only catches a second one
MAX_FUNCTION_LINES = 100
# Longer on purpose, each with its reason: the one place such exceptions are listed.
SIZE_EXCEPTIONS: dict[str, str] = {}


def _sizes() -> list[tuple[str, int, int]]:
    """(name, lines, limit) of every module and function of the package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE.parent).as_posix()
        source = path.read_text()
        found.append((name, len(source.splitlines()), MAX_MODULE_LINES))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                found.append((f"{name}:{node.name}", length, MAX_FUNCTION_LINES))
    return found


def test_modules_and_functions_stay_small() -> None:
    sizes = _sizes()
    too_long = [
        f"{name} ({lines} lines, limit {limit})"
        for name, lines, limit in sizes
        if lines > limit and name not in SIZE_EXCEPTIONS
    ]
    assert not too_long, too_long
    within_limits = {n for n, lines, limit in sizes if lines <= limit}
    stale = sorted(set(SIZE_EXCEPTIONS) & within_limits)
    assert not stale, f"no longer too long, drop from SIZE_EXCEPTIONS: {stale}"
