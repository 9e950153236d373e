"""MkDocs hooks of the documentation site (mkdocs.yml `hooks:`).

- The recipes' RESULTS.md files (and the images they show) become site pages at the same
  path as in the repository (`recipes/demo/RESULTS.md`), so pages link to them as on GitHub.
- The config reference page is generated from the config dataclasses
  (`asr.training.config_reference`).
- Relative links that leave docs/ are resolved in the repository: to a page the site holds
  they become a site link; to another file of the repository (a script, a config) they stay
  its path in code type, linked to the repository when `repo_url` is set; to nothing they
  are a warning, which `--strict` turns into a failed build. README.md's links are checked
  the same way, so one build checks every link of README, docs and RESULTS.md.
"""

from __future__ import annotations

import ast
import functools
import logging
import os
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

from asr.training.config_reference import markdown as config_reference

log = logging.getLogger("mkdocs.plugins.asr_links")
ROOT = Path(__file__).resolve().parents[1]
SITE_FROM_REPO = ("recipes/demo", "recipes/librispeech")
CONFIG_REFERENCE = "reference/config.md"
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
MODULE_TABLE = "<!-- module-table"
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def on_files(files: Files, config) -> Files:
    """Add the recipes' results (with their images) and the generated config reference."""
    for folder in SITE_FROM_REPO:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix.lower() in {".md", ".png", ".svg", ".jpg"}:
                uri = path.relative_to(ROOT).as_posix()
                files.append(File.generated(config, uri, abs_src_path=str(path)))
    files.append(File.generated(config, CONFIG_REFERENCE, content=config_reference()))
    return files


def on_pre_build(config) -> None:
    """Check README.md's relative links (files and headings) before the pages are built."""
    heading_slugs.cache_clear()  # `mkdocs serve` builds again after an edit
    for problem in broken_links(ROOT / "README.md"):
        log.warning(problem)


def on_page_markdown(markdown: str, page, config, files: Files) -> str:
    """Rewrite the page's links that leave docs/ (see the module docstring) and expand the
    architecture page's module table."""
    if MODULE_TABLE in markdown:
        markdown = markdown.split(MODULE_TABLE)[0] + module_table()
    source = _repo_path(page.file)
    site_dir = posixpath.dirname(page.file.src_uri)

    def rewrite(match: re.Match) -> str:
        bang, text, target = match.groups()
        path, _, anchor = target.partition("#")
        if not path or "://" in path or path.startswith("mailto:"):
            return match.group(0)
        repo_target = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
        if files.get_file_from_path(posixpath.normpath(posixpath.join(site_dir, path))):
            return match.group(0)  # inside the site: MkDocs validates it
        if files.get_file_from_path(repo_target):
            relative = posixpath.relpath(repo_target, site_dir or ".")
            return f"{bang}[{text}]({relative}{'#' + anchor if anchor else ''})"
        if not (ROOT / repo_target).exists():
            log.warning(f"{source}: link to {target}, which is not in the repository")
            return match.group(0)
        repo_url = config.get("repo_url")
        if repo_url:
            return f"[{text}]({repo_url.rstrip('/')}/blob/main/{repo_target})"
        return text if text.startswith("`") else f"{text} (`{repo_target}`)"

    return _outside_fences(markdown, lambda stretch: LINK.sub(rewrite, stretch))


def module_table() -> str:
    """One Markdown table per package of `asr`: each module and its docstring's first
    sentence (cut at its first colon when it runs past 200 characters)."""
    packages: dict[str, list[tuple[str, str]]] = {}
    for path in sorted((ROOT / "asr").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        first = " ".join(doc.split("\n\n")[0].split())
        sentence = re.split(r"(?<=[a-z)`])\. ", first)[0].rstrip(".:")
        if len(sentence) > 200:
            sentence = sentence.split(": ")[0]
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        packages.setdefault(package, []).append((module, sentence))
    out = []
    for package, rows in sorted(packages.items(), key=lambda item: _flow_order(item[0])):
        out += [f"### `{package}`", "", "| module | job |", "| --- | --- |"]
        out += [f"| `{name}` | {text.replace('|', '/')} |" for name, text in rows]
        out.append("")
    return "\n".join(out)


def _flow_order(package: str) -> tuple[int, str]:
    """Packages in the order data flows through them (the architecture page's picture)."""
    flow = ("data", "models", "losses", "training", "decoding", "inference", "demo", "gpu_check")
    parts = package.split(".")
    top = parts[1] if len(parts) > 1 else ""
    return (flow.index(top) + 1 if top in flow else len(flow) + 1 if top else 0, package)


def broken_links(path: Path) -> list[str]:
    """The relative links of the Markdown file `path` whose file or heading does not exist."""
    problems = []
    text = "\n".join(_lines_outside_fences(path.read_text()))
    for _, _, target in LINK.findall(text):
        file, _, anchor = target.partition("#")
        if "://" in target or target.startswith("mailto:"):
            continue
        resolved = (path.parent / file).resolve() if file else path
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        if resolved == ROOT / "docs" / CONFIG_REFERENCE:  # generated when the site is built
            continue
        if not resolved.exists():
            problems.append(f"{name}: link to {target}, which does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in heading_slugs(resolved):
            problems.append(f"{name}: link to {target}: no such heading")
    return problems


@functools.cache
def heading_slugs(path: Path) -> set[str]:
    """GitHub's anchors of the headings of a Markdown file."""
    slugs: set[str] = set()
    for line in _lines_outside_fences(path.read_text()):
        match = HEADING.match(line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(2).lower()).replace(" ", "-")
            slugs.add(slug)
    return slugs


def _repo_path(file: File) -> str:
    """Where a page lives in the repository, relative to its root."""
    if file.abs_src_path is None:  # generated from code: as if it were in docs/
        return f"docs/{file.src_uri}"
    return Path(os.path.relpath(file.abs_src_path, ROOT)).as_posix()


def _lines_outside_fences(text: str) -> list[str]:
    kept: list[str] = []
    _outside_fences(text, lambda stretch: kept.append(stretch) or stretch)
    return "".join(kept).splitlines()


def _outside_fences(text: str, change) -> str:
    """`text` with `change` applied to each stretch outside fenced code blocks."""
    out, stretch, fenced = [], [], False
    for line in text.splitlines(keepends=True):
        if FENCE.match(line):
            if not fenced:
                out.append(change("".join(stretch)))
                stretch = []
            fenced = not fenced
            out.append(line)
        elif fenced:
            out.append(line)
        else:
            stretch.append(line)
    out.append(change("".join(stretch)))
    return "".join(out)
