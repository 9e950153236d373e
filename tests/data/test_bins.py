import numpy as np
import pytest
import yaml
from lhotse import CutSet

from asr.data.bins import (
    CutLengths,
    bin_index,
    bucket_of,
    duration_index,
    equal_total_edges,
    estimate_bins,
    main,
    read_bins,
    token_sub_bins,
    write_bins,
)
from asr.data.buckets import SamplerConfig, build_sampler
from asr.data.synthetic_cuts import synthetic_cuts
from asr.data.tokenizer import Tokenizer

TRAIN = "train-clean-100"
PLANTED = 6


@pytest.fixture(scope="module")
def tokenizer(tiny_corpus) -> Tokenizer:
    return Tokenizer.load(tiny_corpus.tokenizer)


@pytest.fixture(scope="module")
def words(tiny_corpus) -> list[str]:
    return sorted({w for text in tiny_corpus.transcripts(TRAIN).values() for w in text.split()})


def clean_cuts(words: list[str]) -> list:
    """LibriSpeech-like cuts of 4 s and more: below that, a handful of words makes the
    tokens-per-second tail heavy enough for genuine 4-sigma cuts."""
    return [c for c in synthetic_cuts(1600, seed=3, vocabulary=words) if c.duration >= 4.0]


@pytest.fixture(scope="module")
def cuts_with_outliers(words):
    """The clean cuts with PLANTED of them given 5x their words."""
    cuts = clean_cuts(words)
    rng = np.random.default_rng(0)
    planted = {cuts[i].id for i in rng.choice(len(cuts), PLANTED, replace=False)}
    for cut in cuts:
        if cut.id in planted:
            repeated = cut.supervisions[0].transform_text(lambda t: " ".join([t] * 5))
            cut.supervisions = [repeated]
    return CutSet.from_cuts(cuts), planted


def test_equal_total_edges_split_within_one_cut() -> None:
    # Jitter breaks the ties of 10 ms rounding: tied cuts must share a bucket.
    durations = np.array([c.duration for c in synthetic_cuts(3000, seed=1)])
    durations += np.random.default_rng(0).uniform(0, 0.01, len(durations))
    for k in (2, 7, 30):
        edges = equal_total_edges(durations, k)
        assert len(edges) == k and edges == sorted(edges) and edges[-1] == durations.max()
        which = np.searchsorted(edges, durations, side="left")
        totals = np.bincount(which, weights=durations, minlength=k)
        assert np.all(np.abs(totals - durations.sum() / k) <= durations.max()), totals


def test_identical_edges_are_merged() -> None:
    values = np.array([5.0] * 500 + [1.0, 2.0, 9.0])
    edges = equal_total_edges(values, 6)
    assert edges == sorted(set(edges)) and 5.0 in edges and len(edges) < 6
    with pytest.raises(ValueError, match="cannot fill"):
        equal_total_edges([1.0, 2.0], 3)


def test_2d_bins_split_tokens_inside_each_duration_bin() -> None:
    cuts = synthetic_cuts(3000, seed=2)
    lengths = CutLengths(
        [c.id for c in cuts],
        np.array([c.duration for c in cuts]),
        np.array([c.custom["num_tokens"] for c in cuts]),
    )
    duration_bins = equal_total_edges(lengths.durations, 5)
    bins = token_sub_bins(lengths, duration_bins, 4)
    assert bins == sorted(bins) and {d for d, _ in bins} == set(duration_bins)
    which = [bin_index(bins, d, t) for d, t in zip(lengths.durations, lengths.tokens, strict=True)]
    assert max(which) < len(bins)  # every cut fits a bin
    for edge in duration_bins:
        sub = [i for i, (d, _) in enumerate(bins) if d == edge]
        assert len(sub) == 4
        totals = np.array([lengths.tokens[np.array(which) == i].sum() for i in sub])
        # Token counts tie a lot, and tied cuts share a sub-bucket: each total lies within
        # the largest tie group (value x count) of the target.
        values, counts = np.unique(
            np.concatenate([lengths.tokens[np.array(which) == i] for i in sub]), return_counts=True
        )
        assert np.all(np.abs(totals - totals.mean()) <= (values * counts).max()), totals


def test_tps_outliers_are_exactly_the_planted_ones(cuts_with_outliers, tokenizer, words):
    clean = CutLengths.of(clean_cuts(words), tokenizer, progress=False)
    assert estimate_bins(clean, num_buckets=6, num_token_buckets=3)[1].above_max == 0
    cuts, planted = cuts_with_outliers
    lengths = CutLengths.of(cuts, tokenizer, progress=False)
    keys, report = estimate_bins(lengths, num_buckets=6, num_token_buckets=3)
    assert report.above_max == PLANTED and report.below_min == 0
    assert len(keys["max_tps"]) == len(keys["bucket_duration_bins"])

    cfg = {**keys, "bucket_batch_size": [8] * len(keys["max_tps"]), "max_cut_duration": 40}
    sampler = build_sampler(cuts, cfg, tokenizer=tokenizer)
    sampled = [c.id for batch in sampler for c in batch]
    dropped = sampler.cut_filter.dropped
    assert dropped["tokens per second above max_tps"] == planted
    assert set(dropped) == {"tokens per second above max_tps"}
    assert sorted(sampled) == sorted(set(cuts.ids) - planted)  # each other cut exactly once


def test_global_tps_limits_count_each_reason(cuts_with_outliers, tokenizer) -> None:
    cuts, planted = cuts_with_outliers
    cfg = {"max_duration": 200, "max_cut_duration": 40, "max_tps": 20.0, "min_tps": 1.0}
    sampler = build_sampler(cuts, cfg, tokenizer=tokenizer)
    sampled = {c.id for batch in sampler for c in batch}
    counts = sampler.cut_filter.counts()
    assert sum(counts.values()) + len(sampled) == len(cuts)
    assert sampler.cut_filter.dropped["tokens per second above max_tps"] >= planted


def test_cli_writes_a_bins_file_the_sampler_reads(tmp_path, cuts_with_outliers, tiny_corpus):
    cuts, _ = cuts_with_outliers
    manifest = tmp_path / "cuts.jsonl.gz"
    cuts.to_file(manifest)
    out = tmp_path / "bins.yaml"
    args = [str(manifest), "--tokenizer", str(tiny_corpus.tokenizer), "--num-buckets", "5"]
    main([*args, "--num-token-buckets", "2", "-o", str(out)])
    keys = yaml.safe_load(out.read_text())
    assert len(keys["bucket_duration_bins"]) == len(keys["max_tps"]) <= 10
    assert out.read_text().startswith("# asr-estimate-bins")
    cfg = SamplerConfig.from_mapping({"bins_file": str(out)})
    assert cfg.bucket_duration_bins[0] == tuple(keys["bucket_duration_bins"][0])
    assert cfg.max_tps == tuple(keys["max_tps"])
    with pytest.raises(FileNotFoundError, match="asr-estimate-bins"):
        read_bins(tmp_path / "missing.yaml")


def test_cli_bins_audio_without_transcripts_by_duration_alone(tmp_path, cuts_with_outliers):
    cuts, _ = cuts_with_outliers
    silent = CutSet.from_cuts(
        c.map_supervisions(lambda s: s.transform_text(lambda _: "")) if i % 2 else c
        for i, c in enumerate(cuts)
    )  # half of them without a transcript: pre-training counts them all
    manifest = tmp_path / "cuts.jsonl.gz"
    silent.to_file(manifest)
    out = tmp_path / "bins.yaml"
    main([str(manifest), "--num-buckets", "4", "-o", str(out)])
    keys = yaml.safe_load(out.read_text())
    durations = [c.duration for c in cuts]
    assert keys == {"bucket_duration_bins": equal_total_edges(durations, 4)}
    assert "by duration alone" in out.read_text()
    assert not SamplerConfig.from_mapping({"bins_file": str(out)}).uses_tokens()
    with pytest.raises(SystemExit):
        main([str(manifest), "--num-token-buckets", "2", "-o", str(out)])


def test_one_bucket_rule_for_scalar_vectorized_and_2d_lookups() -> None:
    """First edge >= the value (lhotse's bisect_left), len(bins) beyond the last edge,
    whichever function asks; 2D bins also need the token edge to hold."""
    edges = [2.0, 5.0, 9.0]
    durations = np.array([0.5, 2.0, 2.01, 5.0, 8.99, 9.0, 9.01])
    expected = [0, 0, 1, 1, 2, 2, 3]
    assert bucket_of(durations, edges).tolist() == expected
    assert [bin_index(edges, d) for d in durations] == expected
    assert [duration_index(edges, d) for d in durations] == expected
    two_d = [(2.0, 10), (2.0, 20), (5.0, 30), (9.0, 60)]
    assert bin_index(two_d, 1.0, 10) == 0 and bin_index(two_d, 1.0, 11) == 1
    assert bin_index(two_d, 1.0, 25) == 2  # too many tokens for its duration: a longer bin
    assert bin_index(two_d, 6.0, 61) == 4 and bin_index(two_d, 9.5, 1) == 4  # fits none
    assert duration_index(two_d, 2.0) == 0 and duration_index(two_d, 9.5) == 4


def test_a_cut_beyond_the_last_bin_is_dropped_as_such_even_with_per_bin_tps_limits() -> None:
    from lhotse import MonoCut

    from asr.data.buckets import CutFilter

    cut_filter = CutFilter(0.0, 100.0, [2.0, 5.0], max_tps=[3.0, 3.0])
    long_fast = MonoCut(id="long", start=0, duration=6.0, channel=0, custom={"num_tokens": 60})
    short_fast = MonoCut(id="short", start=0, duration=1.0, channel=0, custom={"num_tokens": 9})
    assert cut_filter.reason(long_fast) == "beyond the last bucket"
    assert cut_filter.reason(short_fast) == "tokens per second above max_tps"


def test_a_bins_file_replaces_the_configs_buckets(tmp_path) -> None:
    """A preset's shipped buckets (`batches=demo`) give way to a bins file, whole: its bins,
    its batch sizes (none here: max_duration batches), and a per-bucket max_tps with them;
    a single max_tps stays unless the file has its own."""
    out = tmp_path / "bins.yaml"
    write_bins(out, {"bucket_duration_bins": [2.0, 5.0]}, "by hand")
    shipped = {
        "bucket_duration_bins": [[3.0, 30], [8.0, 80]],
        "bucket_batch_size": [9, 4],
        "max_tps": [12.0, 12.5],
    }
    cfg = SamplerConfig.from_mapping({**shipped, "bins_file": str(out)})
    assert cfg.bucket_duration_bins == (2.0, 5.0)
    assert cfg.bucket_batch_size is None and cfg.max_tps is None
    cfg = SamplerConfig.from_mapping({"max_tps": 14.0, "bins_file": str(out)})
    assert cfg.max_tps == 14.0
    write_bins(out, {"bucket_duration_bins": [2.0, 5.0], "max_tps": [13.0, 11.0]}, "by hand")
    assert SamplerConfig.from_mapping({"max_tps": 14.0, "bins_file": str(out)}).max_tps == (
        13.0,
        11.0,
    )
