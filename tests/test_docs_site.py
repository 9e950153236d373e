"""The documentation site: `mkdocs build --strict` passes with every page, and its link
check (docs/hooks.py) finds broken links in README, docs and RESULTS.md files."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = (
    "getting-started",
    "training",
    "reference/config",
    "data",
    "loss",
    "aed",
    "ssl",
    "distributed",
    "savers",
    "adpsgd",
    "gpu",
    "decoding",
    "export",
    "transcribe",
    "recipes",
    "architecture",
    "development",
    "recipes/demo/RESULTS",
    "recipes/librispeech/RESULTS",
)
API = {
    "models": "ConformerEncoder",
    "losses": "samplewise_transducer_loss",
    "data": "build_sampler",
    "decoding": "beam_search",
    "inference": "Recognizer",
    "training": "AsrLitModule",
}


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_the_site_builds_strictly_with_every_page(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    mkdocs = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)]
    result = subprocess.run(mkdocs, cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    for page in PAGES:
        assert (tmp_path / page / "index.html").is_file(), page
    for package, name in API.items():
        assert name in (tmp_path / "api" / package / "index.html").read_text(), package
    reference = (tmp_path / "reference" / "config" / "index.html").read_text()
    assert "model.encoder.num_layers" in reference
    assert "distributed.compression.exchange" in reference
    architecture = (tmp_path / "architecture" / "index.html").read_text()
    assert "asr.losses.samplewise" in architecture and "asr.data.rank_sync" in architecture
    assert (tmp_path / "recipes" / "demo" / "images" / "training.png").is_file()


def test_the_link_check_finds_missing_files_and_headings(tmp_path: Path) -> None:
    hooks = _hooks()
    (tmp_path / "target.md").write_text("# A title, with `code`\n\n## Second (2026-11-27)\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](target.md#a-title-with-code) [ok](target.md#second-2026-11-27)\n"
        "[gone](missing.md) [bad](target.md#nothing) [web](https://example.com/x)\n"
        "```bash\n[not a link](inside-a-fence.md)\n```\n[own](#page)\n# Page\n"
    )
    problems = hooks.broken_links(page)
    assert len(problems) == 2, problems
    assert "missing.md, which does not exist" in problems[0]
    assert "target.md#nothing: no such heading" in problems[1]


def test_the_readme_and_results_have_no_broken_link() -> None:
    hooks = _hooks()
    files = [ROOT / "README.md", *sorted((ROOT / "recipes").glob("*/RESULTS.md"))]
    files += sorted((ROOT / "docs").rglob("*.md"))
    problems = [problem for path in files for problem in hooks.broken_links(path)]
    assert not problems, "\n".join(problems)


def test_the_readme_opens_with_the_two_commands_and_links_every_page() -> None:
    """The README is a front page: its first code block holds the two commands a newcomer
    runs, and every page of docs/ is one link away."""
    text = (ROOT / "README.md").read_text()
    first_block = text.split("```")[1].splitlines()[1:]
    commands = [line.split("#")[0].split() for line in first_block if line.strip()]
    assert commands == [["make", "demo"], ["make", "test"]]
    pages = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
    assert pages and not [page for page in pages if f"]({page}" not in text]
