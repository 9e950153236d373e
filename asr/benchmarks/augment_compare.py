"""The comparison `recipes/demo/augment.sh` ends with: the demo trained without and with
on-the-fly augmentation, decoded on clean, noisy and reverberant test sets; one JSON table.

    python -m asr.benchmarks.augment_compare exp/demo_augment_compare --models none augment \\
        --testsets test-clean test-clean-snr20 test-clean-snr10 ... -o compare.json

Read from the recipe's folders, per model `<exp>/<model>/`: the WER of each test set
(`decode-<testset>/wer.json`), the training wall seconds (`wall_seconds`) and time per
optimizer step (`debug.step_times_dir`, as `asr.benchmarks.ssl_compare.throughput`
measures it). Per model, `ratio_to_clean`: each test set's WER over its test-clean WER
(the robustness the augmentation buys); `clean_wer_change`: a model's test-clean WER minus
the first model's, in points (what it costs on clean speech).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from asr.benchmarks.ssl_compare import throughput

CLEAN = "test-clean"


def model_record(exp: Path, model: str, testsets: list[str]) -> dict[str, Any]:
    """One model's WERs, ratios to its clean WER, wall seconds and step times."""
    folder = exp / model
    wer = {}
    for testset in testsets:
        path = folder / f"decode-{testset}" / "wer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run the recipe's decode stage")
        wer[testset] = json.loads(path.read_text())["wer"]
    record: dict[str, Any] = {"model": model, "wer": wer}
    if CLEAN in wer and wer[CLEAN] > 0:
        record["ratio_to_clean"] = {t: round(w / wer[CLEAN], 3) for t, w in wer.items()}
    wall = folder / "wall_seconds"
    record["wall_seconds"] = int(wall.read_text()) if wall.is_file() else None
    record["training"] = throughput(folder / "step_times")
    return record


def compare(exp: Path, models: list[str], testsets: list[str]) -> dict[str, Any]:
    """The table of every model (the first is the reference for `clean_wer_change`)."""
    records = [model_record(exp, model, testsets) for model in models]
    reference = records[0]["wer"].get(CLEAN)
    for record in records:
        if reference is not None and CLEAN in record["wer"]:
            record["clean_wer_change"] = round(record["wer"][CLEAN] - reference, 3)
    return {"testsets": testsets, "models": records}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="augment_compare", description=__doc__.split("\n")[0])
    parser.add_argument("exp", type=Path, help="the recipe's exp folder")
    parser.add_argument("--models", nargs="+", required=True, help="first: the reference")
    parser.add_argument("--testsets", nargs="+", required=True)
    parser.add_argument("-o", "--output", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    text = json.dumps(compare(args.exp, args.models, args.testsets), indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
