"""Every docs page that the package names (error messages, help, docstrings) exists, with
the section its `#anchor` names; and no message sends a user to the README, a front page
whose sections come and go."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"docs/([\w/-]+\.md)(?:#([\w-]+))?")


def _slug(heading: str) -> str:
    """The anchor mkdocs gives a heading (its default `toc` slugify)."""
    text = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    headings = re.findall(r"^#+\s+(.+?)\s*$", page.read_text(), flags=re.MULTILINE)
    return {_slug(h) for h in headings}


def _strings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_every_docs_link_in_the_package_resolves() -> None:
    broken, checked = [], 0
    for path in sorted((ROOT / "asr").rglob("*.py")):
        for line, text in _strings(path):
            for page, anchor in LINK.findall(text):
                checked += 1
                where = f"{path.relative_to(ROOT)}:{line}: docs/{page}"
                target = ROOT / "docs" / page
                if not target.is_file():
                    broken.append(f"{where}: no such page")
                elif anchor and anchor not in _anchors(target):
                    broken.append(f"{where}#{anchor}: no such section")
    assert not broken, "\n".join(broken)
    assert checked > 20  # the scan does find the package's links


def test_no_message_points_at_the_readme() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sorted((ROOT / "asr").rglob("*.py"))
        for line, text in _strings(path)
        if "README" in text
    ]
    assert not found, found
