"""asr-subset-cuts: a fixed, seeded share of a manifest by audio duration."""

from __future__ import annotations

import json

import pytest
from lhotse import CutSet

from asr.data.subset import main, seeded_subset


@pytest.fixture(scope="module")
def cuts(tiny_corpus) -> CutSet:
    return CutSet.from_file(tiny_corpus.cuts("train-clean-100")).to_eager()


def _ids(cuts: CutSet) -> list[str]:
    return [cut.id for cut in cuts]


def test_the_subset_reaches_the_fraction_by_duration_and_keeps_the_order(cuts) -> None:
    total = sum(c.duration for c in cuts)
    subset = seeded_subset(cuts, 0.3, seed=1)
    durations = [c.duration for c in subset]
    assert sum(durations) >= 0.3 * total
    # it stops at the first cut that reaches the share: less over it than one cut
    assert sum(durations) < 0.3 * total + max(durations)
    order = _ids(cuts)
    assert _ids(subset) == sorted(_ids(subset), key=order.index)
    assert len(set(_ids(subset))) == len(subset) < len(cuts)


def test_same_seed_same_subset_and_a_larger_share_holds_the_smaller(cuts) -> None:
    small, again = seeded_subset(cuts, 0.2, seed=3), seeded_subset(cuts, 0.2, seed=3)
    assert _ids(small) == _ids(again)
    assert set(_ids(small)) <= set(_ids(seeded_subset(cuts, 0.5, seed=3)))
    assert _ids(small) != _ids(seeded_subset(cuts, 0.2, seed=4))
    assert _ids(seeded_subset(cuts, 1.0, seed=3)) == _ids(cuts)


def test_the_command_writes_the_subset_and_names_a_bad_fraction(
    tiny_corpus, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tiny_corpus.cuts("train-clean-100")
    out = tmp_path / "subset.jsonl.gz"
    main([str(manifest), "--seed", "0", "--fraction", "0.25", "-o", str(out)])
    summary = json.loads(capsys.readouterr().out)
    assert summary["cuts"] == len(CutSet.from_file(out)) and summary["fraction"] == 0.25
    assert summary["seconds"] >= 0.25 * summary["of_seconds"] - 0.1
    for bad in ("1.5", "0"):
        with pytest.raises(SystemExit) as stopped:
            main([str(manifest), "--fraction", bad, "-o", str(out)])
        assert stopped.value.code == 1
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.endswith(f"error: {manifest}: --fraction must be in (0, 1], got {float(bad)}")
    with pytest.raises(SystemExit):
        main([str(tmp_path / "none.jsonl.gz"), "--fraction", "0.1", "-o", str(out)])
    assert "none.jsonl.gz" in capsys.readouterr().err
