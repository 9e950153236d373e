import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import yaml

from asr.data.buckets import SamplerConfig
from asr.training import oomptimizer, probes
from asr.training.oomptimizer import (
    BatchSizeSearch,
    Bucket,
    BucketResult,
    ModelSetup,
    ProbeResult,
    buckets_from_bins,
    compose_config,
    cpu_probe,
    merge_equal_sizes,
    parse_memory_size,
    plan_differences,
    search_bucket,
    search_buckets,
)

MiB = 2**20
# A ~20k-parameter Transducer: a worst-case 8 s utterance costs ~8 MiB on the CPU.
TINY_MODEL = [
    "experiment=demo",
    "model.encoder.num_layers=1",
    "model.encoder.d_model=32",
    "model.encoder.num_heads=2",
    "model.encoder.subsampling_channels=16",
    "model.predictor.embed_dim=32",
    "model.predictor.hidden_dim=32",
    "model.joiner.joint_dim=32",
]


def run_search(limit: int, **options) -> tuple[BatchSizeSearch, list[int]]:
    """Drive a search against a planted limit: sizes up to `limit` fit."""
    search, tried = BatchSizeSearch(**options), []
    while (size := search.next_size()) is not None:
        tried.append(size)
        search.report(size, fits=size <= limit)
    return search, tried


# --- the state machine --------------------------------------------------------------------


def check_search(limit: int, start: int) -> None:
    search, tried = run_search(limit, start=start)
    result = search.result
    assert result <= limit  # a size that fitted, never one that failed
    assert result in tried and search.fail is not None and search.fail > limit
    assert (limit - result) / result <= 0.05
    if limit < 20:  # within 5 % of a size under 20 is the size itself
        assert result == limit
    assert search.probes == len(tried) == len(set(tried))
    # Doubling to the limit, then bisecting a gap of at most the limit: log2 N each; a
    # start above the limit first halves down to it.
    halvings = math.ceil(math.log2(start / limit)) if start > limit else 0
    assert search.probes <= 2 * math.ceil(math.log2(max(limit, 2))) + halvings + 2


@pytest.mark.parametrize("start", [1, 16, 64, 5000])
@pytest.mark.parametrize("limit", [1, 7, 1000, 12345, 999_999])
def test_search_finds_a_planted_limit_in_logarithmic_probes(limit: int, start: int) -> None:
    check_search(limit, start)


@pytest.mark.parametrize("start", [1, 3, 16])
def test_search_finds_every_limit_up_to_2000(start: int) -> None:
    for limit in range(1, 2001):
        check_search(limit, start)


@pytest.mark.parametrize("limit", [5, 1000, 12345])
def test_zero_tolerance_finds_the_exact_limit(limit: int) -> None:
    search, _ = run_search(limit, start=16, rel_tolerance=0.0)
    assert search.result == limit


def test_failing_start_halves_down() -> None:
    search, tried = run_search(5, start=64)
    assert tried[:5] == [64, 32, 16, 8, 4]  # halving until 4 fits
    assert tried[5:] == [6, 5]  # bisection between 4 and 8
    assert (search.result, search.fit, search.fail) == (5, 5, 6)


def test_nothing_fits_ends_with_zero() -> None:
    search, tried = run_search(0, start=16)
    assert tried == [16, 8, 4, 2, 1]
    assert search.done and search.result == 0


def test_max_size_caps_the_search() -> None:
    search, tried = run_search(1000, start=16, max_size=100)
    assert max(tried) == 100 and search.result == 100
    search, tried = run_search(1000, start=500, max_size=100)
    assert tried == [100] and search.result == 100
    search, _ = run_search(70, start=16, max_size=100, rel_tolerance=0.0)
    assert search.result == 70


def test_reports_must_answer_the_asked_size() -> None:
    search = BatchSizeSearch(start=16)
    with pytest.raises(ValueError, match="expected the outcome of batch size 16, got 32"):
        search.report(32, fits=True)
    with pytest.raises(RuntimeError, match="not over: try batch size 16"):
        _ = search.result
    search.report(16, fits=True)
    assert search.next_size() == 32
    done, _ = run_search(3, start=4)
    with pytest.raises(RuntimeError, match="the search is over"):
        done.report(3, fits=True)
    with pytest.raises(ValueError, match="start must be >= 1"):
        BatchSizeSearch(start=0)


# --- buckets --------------------------------------------------------------------------------


def test_bins_give_worst_case_buckets() -> None:
    buckets, is_2d = buckets_from_bins([2, 4.5, 8], max_tps=12)
    assert not is_2d
    assert buckets == [Bucket(2.0, 24), Bucket(4.5, 54), Bucket(8.0, 96)]
    buckets, is_2d = buckets_from_bins([[2, 10], [2, 30], [4, 50]])
    assert is_2d and buckets == [Bucket(2.0, 10), Bucket(2.0, 30), Bucket(4.0, 50)]
    assert buckets_from_bins([2.1], max_tps=10)[0] == [Bucket(2.1, 21)]  # not 22 from 21.000001


def test_per_bucket_max_tps_bounds_tokens_and_is_kept() -> None:
    buckets, _ = buckets_from_bins([2, 4], max_tps=[10, 7.5])
    assert buckets == [Bucket(2.0, 20, 10.0), Bucket(4.0, 30, 7.5)]
    buckets, _ = buckets_from_bins([[2, 10], [4, 50]], max_tps=[9, 13])
    assert buckets == [Bucket(2.0, 10, 9.0), Bucket(4.0, 50, 13.0)]  # 2D: tokens from the bins
    with pytest.raises(ValueError, match="3 max_tps values for 2 buckets"):
        buckets_from_bins([2, 4], max_tps=[1, 2, 3])


@pytest.mark.parametrize(
    ("bins", "message"),
    [
        ([], "non-empty list"),
        ([2, [4, 10]], "mix 1D"),
        ([4, 2], "increasing"),
        ([2, 2], "increasing"),
        ([[2, 10, 3]], r"\[seconds, tokens\]"),
    ],
)
def test_bad_bins_are_refused(bins: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        buckets_from_bins(bins)


class FakeProbe:
    """Fits when batch x ceil(duration) <= capacity; records every call."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.calls: list[tuple[float, int, int]] = []

    def __call__(self, max_duration: float, max_tokens: int, batch_size: int) -> ProbeResult:
        self.calls.append((max_duration, max_tokens, batch_size))
        used = batch_size * math.ceil(max_duration)
        return ProbeResult(used <= self.capacity, used * MiB, "" if used <= self.capacity else "x")


def test_buckets_are_searched_largest_first_from_the_previous_result() -> None:
    probe = FakeProbe(capacity=200)
    buckets, _ = buckets_from_bins([1.5, 2, 4, 8])
    results = search_buckets(buckets, probe, start=16, rel_tolerance=0.0)
    assert [r.batch_size for r in results] == [100, 100, 50, 25]
    assert [r.bucket for r in results] == buckets  # returned in the buckets' order
    firsts = {}
    for duration, _, size in probe.calls:
        firsts.setdefault(duration, size)
    assert list(firsts) == [8.0, 4.0, 2.0, 1.5]  # largest first, each bucket once
    assert list(firsts.values()) == [16, 25, 50, 100]  # each from the previous result
    assert [r.peak_bytes for r in results] == [200 * MiB] * 4  # batch x ceil(duration)
    assert sum(r.probes for r in results) == len(probe.calls)


def test_equal_sizes_merge_into_the_larger_edge() -> None:
    buckets, _ = buckets_from_bins([1.5, 2, 4, 8])
    results = search_buckets(buckets, FakeProbe(capacity=200), start=16, rel_tolerance=0.0)
    merged = merge_equal_sizes(results)
    assert [(r.bucket.max_duration, r.batch_size) for r in merged] == [(2, 100), (4, 50), (8, 25)]
    assert merged[0].probes == results[0].probes + results[1].probes
    assert oomptimizer.sampler_keys(merged, is_2d=False) == {
        "bucket_duration_bins": [2.0, 4.0, 8.0],
        "bucket_batch_size": [100, 50, 25],
    }
    sizes = [5, 5, 5, 3, 3, 1]
    results = [BucketResult(Bucket(d + 1.0, 1), s, None, 1) for d, s in enumerate(sizes)]
    merged = merge_equal_sizes(results)
    assert [(r.bucket.max_duration, r.batch_size, r.probes) for r in merged] == [
        (3.0, 5, 3),
        (5.0, 3, 2),
        (6.0, 1, 1),
    ]


def test_equal_sizes_merge_only_where_the_larger_bucket_allows_as_many_tokens_per_second() -> None:
    limits = [12.0, 14.0, 11.0, 13.0]  # the 4 s bucket's limit is below the 2 s bucket's
    buckets = [Bucket(d, math.ceil(d * x), x) for d, x in zip([1.5, 2, 4, 8], limits, strict=True)]
    results = [BucketResult(b, 50, None, 1) for b in buckets]
    merged = merge_equal_sizes(results)
    # 1.5 s into 2 s (14 >= 12), not 2 s into 4 s (11 < 14), 4 s into 8 s (13 >= 11)
    assert [r.bucket.max_duration for r in merged] == [2.0, 8.0]
    assert oomptimizer.sampler_keys(merged, is_2d=False)["max_tps"] == [14.0, 13.0]


def test_a_bucket_where_nothing_fits_is_named() -> None:
    with pytest.raises(RuntimeError, match=r"bucket 8 s / 96 tokens: even batch size 1"):
        search_bucket(Bucket(8.0, 96), FakeProbe(capacity=7), BatchSizeSearch(start=4))


# --- memory sizes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("6GiB", 6 * 2**30),
        ("512MiB", 512 * MiB),
        ("4G", 4 * 2**30),
        ("4g", 4 * 2**30),
        ("8GB", 8 * 10**9),
        ("1.5 GiB", 3 * 2**29),
        ("100k", 102_400),
        ("1048576", 1_048_576),
        ("2TiB", 2 * 2**40),
    ],
)
def test_memory_sizes_parse(text: str, size: int) -> None:
    assert parse_memory_size(text) == size


@pytest.mark.parametrize("text", ["6 gigs", "", "-1G", "0", "GiB", "4Q", "1e9"])
def test_bad_memory_sizes_are_refused_with_the_valid_forms(text: str) -> None:
    with pytest.raises(ValueError, match=rf"invalid memory size '{text}'.*e\.g\. 6GiB"):
        parse_memory_size(text)


# --- probes -----------------------------------------------------------------------------------


def test_vocab_size_comes_from_the_tokenizer_or_the_option(tmp_path: Path) -> None:
    cfg = compose_config([*TINY_MODEL, f"data_dir={tmp_path}"])
    with pytest.raises(ValueError, match=r"tokenizer/bpe128\.model does not exist.*--vocab-size"):
        ModelSetup.from_config(cfg)
    setup = ModelSetup.from_config(cfg, vocab_size=64)
    assert (setup.vocab_size, setup.num_mel_bins) == (64, 80)
    assert setup.model["loss"]["transducer_start_step"] == 280
    bad = compose_config([*TINY_MODEL, f"data_dir={tmp_path}", "+model.encoder.depth=2"])
    with pytest.raises(ValueError, match=r"unknown config key model\.encoder\.depth"):
        ModelSetup.from_config(bad, vocab_size=64)


def test_an_encoder_decoder_worst_case_step_trains_its_own_objective(tmp_path: Path) -> None:
    tiny_aed = ["experiment=demo_aed_flash", "model.encoder.num_layers=1"]
    tiny_aed += [
        "model.encoder.d_model=32",
        "model.decoder.d_model=32",
        "model.decoder.num_layers=1",
    ]
    setup = ModelSetup.from_config(compose_config([*tiny_aed, f"data_dir={tmp_path}"]), 64)
    model, objective, optimizer, step = probes.build_training(setup, "cpu")
    assert step == 0 and objective.config.ctc_weight == 0.3
    before = [p.detach().clone() for p in model.parameters()]
    probes.worst_case_step(setup, max_duration=2.0, max_tokens=20, batch_size=3, device="cpu")
    batch = probes.worst_case_batch(3, 2.0, 20, setup.num_mel_bins, setup.vocab_size)
    losses = objective(model, batch, step)
    assert set(losses) == {"loss", "cross_entropy", "ctc"} and losses["loss"].isfinite()
    losses["loss"].backward()
    optimizer.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_dead_probe_processes_do_not_fit_and_crashes_are_errors() -> None:
    result = probes._cpu_result(None, -9, 100 * MiB, 1.0)
    assert not result.fits and result.reason == "probe process killed by SIGKILL"
    stopped = probes._cpu_result(None, probes.WATCHDOG_EXIT_CODE, 100 * MiB, 1.0)
    assert not stopped.fits and "past the budget 100.0 MiB" in stopped.reason
    assert probes._cpu_result({"peak": 99 * MiB}, 0, 100 * MiB, 1.0).fits
    assert not probes._cpu_result({"peak": 101 * MiB}, 0, 100 * MiB, 1.0).fits
    with pytest.raises(RuntimeError, match="exited with code 1"):
        probes._cpu_result(None, 1, 100 * MiB, 1.0)
    with pytest.raises(RuntimeError, match="KeyError: 'x'"):
        probes._cpu_result({"error": "KeyError: 'x'"}, 1, 100 * MiB, 1.0)


@pytest.mark.slow
def test_real_cpu_search_gives_smaller_batches_for_longer_buckets(tmp_path: Path) -> None:
    budget = 100 * MiB
    setup = ModelSetup.from_config(
        compose_config([*TINY_MODEL, f"data_dir={tmp_path}"]), vocab_size=64
    )
    buckets, _ = buckets_from_bins([2, 4, 8], max_tps=12)
    outcomes: list[tuple[Bucket, int, ProbeResult]] = []
    with cpu_probe(setup, budget, num_threads=1) as probe:
        results = search_buckets(
            buckets, probe, start=8, on_probe=lambda *outcome: outcomes.append(outcome)
        )
    sizes = [r.batch_size for r in results]
    assert sizes[0] > sizes[1] > sizes[2] >= 5, sizes
    assert sizes[0] >= 20, sizes
    for r in results:
        assert r.peak_bytes is not None and 10 * MiB < r.peak_bytes <= budget
    failures = [o for _, _, o in outcomes if not o.fits]
    assert failures and all("budget" in o.reason for o in failures)
    for bucket in buckets:  # measured peaks grow with the batch size
        fitted = sorted((size, o.peak_bytes) for b, size, o in outcomes if b == bucket and o.fits)
        peaks = [peak for _, peak in fitted]
        assert peaks == sorted(peaks), fitted


# --- command line -------------------------------------------------------------------------------


@pytest.fixture
def fake_cpu_probe(monkeypatch: pytest.MonkeyPatch) -> FakeProbe:
    fake = FakeProbe(capacity=200)

    @contextmanager
    def fake_probe(setup: ModelSetup, budget: int, num_threads: int | None) -> Iterator[FakeProbe]:
        assert (setup.vocab_size, budget) == (64, 2**30)
        yield fake

    monkeypatch.setattr(oomptimizer, "cpu_probe", fake_probe)
    return fake


def test_cli_writes_sampler_keys_from_a_bins_file(tmp_path: Path, fake_cpu_probe) -> None:
    bins = tmp_path / "bins.yaml"
    bins.write_text("bucket_duration_bins: [1.5, 2, 4, 8]\nmax_tps: [10, 10, 11, 12]\n")
    out = tmp_path / "out" / "batch_sizes.yaml"
    args = ["--bins-file", str(bins), "--memory-budget", "1GiB", "--vocab-size", "64"]
    oomptimizer.main(
        [*TINY_MODEL, f"data_dir={tmp_path}", *args, "--device", "cpu", "-o", str(out)]
        + ["--rel-tolerance", "0"]
    )
    keys = yaml.safe_load(out.read_text())
    assert "# transducer lattice: torch\n" in out.read_text()  # what the probes ran
    assert keys == {
        "bucket_duration_bins": [2.0, 4.0, 8.0],
        "bucket_batch_size": [100, 50, 25],
        "max_tps": [10.0, 11.0, 12.0],  # carried on from the bins file
    }
    sampler = SamplerConfig.from_mapping(keys)  # the keys are data.sampler keys
    assert sampler.bucket_batch_size == (100, 50, 25)
    assert sampler.max_tps == (10.0, 11.0, 12.0)
    max_tokens = {duration: tokens for duration, tokens, _ in fake_cpu_probe.calls}
    assert max_tokens == {8.0: 96, 4.0: 44, 2.0: 20, 1.5: 15}  # d x that bucket's max_tps


def test_cli_keeps_2d_buckets(tmp_path: Path, fake_cpu_probe) -> None:
    out = tmp_path / "batch_sizes.yaml"
    oomptimizer.main(
        [f"data_dir={tmp_path}", "--buckets", "[[2, 20], [2, 40], [4, 60]]", *TINY_MODEL]
        + ["--memory-budget", "1GiB", "--vocab-size", "64", "--device", "cpu", "-o", str(out)]
    )
    keys = yaml.safe_load(out.read_text())
    assert keys["bucket_duration_bins"] == [[2.0, 20], [2.0, 40], [4.0, 60]]
    assert len(keys["bucket_batch_size"]) == 3
    assert keys["bucket_batch_size"][0] == keys["bucket_batch_size"][1]  # 2D: never merged


def test_cli_rejects_a_bad_memory_budget(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        oomptimizer.main(["experiment=demo", "--buckets", "[2]", "--memory-budget", "6 gigs"])
    assert exit_info.value.code == 2
    assert "invalid memory size '6 gigs'" in capsys.readouterr().err


def test_the_worst_case_step_holds_the_optimizer_state_through_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every step after a run's first holds Adam's two moments through forward and
    backward; a probe that makes them only at its optimizer step measures 8 bytes per
    parameter short (the first GPU check ran out of memory in 13 of 30 steps so)."""
    setup = ModelSetup.from_config(compose_config([*TINY_MODEL, f"data_dir={tmp_path}"]), 64)
    seen: dict = {}
    build = probes.build_training

    def build_and_watch(setup: ModelSetup, device: str) -> tuple:
        model, objective, optimizer, step = build(setup, device)

        def at_encoder(module: torch.nn.Module, args: tuple) -> None:
            moments = [v for s in optimizer.state.values() for v in s.values() if v.dim() > 0]
            seen["moment_elements"] = sum(v.numel() for v in moments)
            seen["gradients"] = [p.grad for p in model.parameters()]
            seen["parameters"] = sum(p.numel() for p in model.parameters())

        model.encoder.register_forward_pre_hook(at_encoder)
        return model, objective, optimizer, step

    monkeypatch.setattr(probes, "build_training", build_and_watch)
    probes.worst_case_step(setup, max_duration=2.0, max_tokens=10, batch_size=2, device="cpu")
    assert seen["moment_elements"] == 2 * seen["parameters"] > 0
    assert all(g is None for g in seen["gradients"])  # zero_grad(set_to_none) as in training


# --- pre-training models: audio alone ----------------------------------------------------------

TINY_SSL = [
    "experiment=demo_ssl_w2v_bert",
    "model.encoder.num_layers=2",
    "model.encoder.d_model=32",
    "model.encoder.num_heads=2",
    "model.encoder.subsampling_channels=16",
    "model.w2v_bert.code_dim=16",
    "model.w2v_bert.num_codes=8",
    "model.loss.num_distractors=4",
]


def test_a_pre_training_probe_trains_on_audio_alone(tmp_path: Path) -> None:
    setup = ModelSetup.from_config(compose_config([*TINY_SSL, f"data_dir={tmp_path}"]))
    assert setup.vocab_size is None and setup.model["kind"] == "ssl"
    batch = probes.worst_case_batch(3, 2.0, 0, setup.num_mel_bins, setup.vocab_size)
    assert batch.tokens.shape == (3, 0) and batch.token_lens.tolist() == [0, 0, 0]
    probes.worst_case_step(setup, max_duration=2.0, max_tokens=0, batch_size=3, device="cpu")


def test_cli_sizes_pre_training_batches_by_duration_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[float, int, int]] = []

    @contextmanager
    def fake_probe(setup: ModelSetup, budget: int, num_threads: int | None) -> Iterator:
        assert setup.vocab_size is None
        yield lambda d, t, b: calls.append((d, t, b)) or ProbeResult(b * d <= 40, 1)

    monkeypatch.setattr(oomptimizer, "cpu_probe", fake_probe)
    out = tmp_path / "batch_sizes.yaml"
    args = ["--buckets", "[2, 4]", "--memory-budget", "1GiB", "--device", "cpu", "-o", str(out)]
    oomptimizer.main([*TINY_SSL, f"data_dir={tmp_path}", *args, "--rel-tolerance", "0"])
    keys = yaml.safe_load(out.read_text())
    assert keys == {"bucket_duration_bins": [2.0, 4.0], "bucket_batch_size": [20, 10]}
    assert "# pre-training: audio alone, batches by duration\n" in out.read_text()
    assert {tokens for _, tokens, _ in calls} == {0}
    assert not SamplerConfig.from_mapping(keys).uses_tokens()
    with pytest.raises(SystemExit):
        oomptimizer.main([*TINY_SSL, f"data_dir={tmp_path}", "--buckets", "[[2, 20]]", *args[2:]])
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert "model.kind=ssl pre-trains on audio alone: give 1D bins" in line


def test_plan_differences_name_each_bucket_that_differs() -> None:
    shipped = {"bucket_duration_bins": [[3.0, 30], [8.0, 80]], "bucket_batch_size": [9, 4]}
    assert plan_differences(dict(shipped), shipped) == []
    found = {"bucket_duration_bins": [(3.0, 30), (8.0, 80)], "bucket_batch_size": [11, 4]}
    assert plan_differences(found, shipped) == ["bucket [3.0, 30]: batch size 11 (the config's 9)"]
    other = {"bucket_duration_bins": [2.0, 9.0], "bucket_batch_size": [9, 4]}
    assert plan_differences(other, shipped) == [
        "other buckets: [2.0, 9.0] against the config's [[3.0, 30], [8.0, 80]]"
    ]
    assert plan_differences(found, {"bucket_duration_bins": None}) == [
        "the config has no batch sizes to compare with"
    ]
