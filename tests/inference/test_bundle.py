"""Checkpoints -> bundle -> model (`asr.inference.bundle`), from the checkpoints of the
shared training run and of an attention encoder-decoder run."""

from pathlib import Path

import pytest
import torch

from asr.inference.bundle import (
    BUNDLE_FORMAT,
    checkpoints_to_average,
    export_bundle,
    load_bundle,
    select_checkpoints,
)
from asr.models.aed import EncoderDecoder

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]


def _model_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    return {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}


def test_averaged_weights_are_the_mean_of_two_epochs(trained_run, bundle: Path) -> None:
    n = trained_run.epochs
    older, newer = (trained_run.checkpoints / f"epoch={e:02d}.ckpt" for e in (n - 2, n - 1))
    content = torch.load(bundle, weights_only=True)  # a bundle needs no pickled classes
    assert content["format"] == BUNDLE_FORMAT
    assert content["averaged"] == [str(older), str(newer)]
    a, b = _model_weights(older), _model_weights(newer)
    averaged = content["state_dict"]
    assert averaged.keys() == a.keys() == b.keys()
    moved = 0
    for key, value in averaged.items():
        if value.is_floating_point():
            assert torch.allclose(value, (a[key] + b[key]) / 2, rtol=0, atol=1e-7), key
            moved += int(not torch.equal(a[key], b[key]))
        else:
            assert torch.equal(value, b[key]), key
    assert moved > 10, "the two epochs' weights differ, so the mean is a real test"


def test_average_from_last_checkpoint_uses_its_epoch(trained_run, tmp_path: Path) -> None:
    n = trained_run.epochs
    assert checkpoints_to_average(trained_run.checkpoints / "last.ckpt", 2) == [
        trained_run.checkpoints / f"epoch={e:02d}.ckpt" for e in (n - 2, n - 1)
    ]
    with pytest.raises(FileNotFoundError, match=rf"--average {n + 1} needs .* missing \[-1\]"):
        export_bundle(trained_run.checkpoints / "last.ckpt", tmp_path / "b.pt", average=n + 1)
    assert not (tmp_path / "b.pt").exists()


def test_select_checkpoints_best_and_the_errors(trained_run) -> None:
    assert select_checkpoints(trained_run.checkpoints, best=True) == [
        trained_run.checkpoints / "best.ckpt"
    ]
    with pytest.raises(ValueError, match="is a directory: say which checkpoint"):
        select_checkpoints(trained_run.checkpoints)
    with pytest.raises(ValueError, match="cannot be averaged"):
        select_checkpoints(trained_run.checkpoints, best=True, avg=2)


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "none.pt")):
        load_bundle(tmp_path / "none.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="neither an asr bundle nor an asr-train checkpoint"):
        load_bundle(tmp_path / "other.pt")
    truncated = tmp_path / "truncated.bundle.pt"
    truncated.write_bytes((tmp_path / "other.pt").read_bytes()[:300])
    with pytest.raises(ValueError, match=f"cannot read {truncated}: truncated or not a torch"):
        load_bundle(truncated)


def test_the_checkpoint_exports_to_a_bundle_that_rebuilds_the_same_network(aed_run, tmp_path):
    ckpt = aed_run / "checkpoints" / "last.ckpt"
    bundle = export_bundle(ckpt, tmp_path / "aed.bundle.pt")
    model, tokenizer, features = load_bundle(bundle)
    assert isinstance(model, EncoderDecoder) and len(model.decoder.layers) == 1
    assert tokenizer.vocab_size == model.vocab_size
    weights = _model_weights(ckpt)
    assert model.state_dict().keys() == weights.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())
