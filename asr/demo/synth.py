"""A demo corpus: synthetic English speech in LibriSpeech's directory layout.

Design:

- Plan, then synthesize. `asr.demo.plan.plan_corpus` is pure and cheap: it fixes every
  utterance's text, speaker, rate and pitch to meet the size targets. Noise seeds come
  from (seed, part, utterance index), and utterances are synthesized in fixed chunks,
  each in a fresh process (espeak-ng carries state from one utterance to the next), so
  the audio is the same whatever the number of processes.
- Audio. espeak-ng from the `espeakng_loader` wheel, driven through ctypes, in a pool of
  worker processes with a progress bar. 22,050 Hz speech is resampled to 16 kHz,
  silence trimmed to 0.15 s each side, peak-normalized to -3 dBFS, and given a white-noise
  floor (-65 dBFS RMS) because exact digital silence sends log-mel features to their floor.
- Word times. espeak-ng's word events give each word's start; a word ends where the next
  starts. They are written per chapter beside the transcripts as `*.alignment.txt` in the
  LibriSpeech alignments' format, which `asr.data.corpus.prepare_manifests` reads into the
  supervisions' `alignment["word"]` (the truth the word timestamps are measured against).
- A marker file records the parameters, so a re-run with the same ones skips.
"""

import argparse
import json
import math
import multiprocessing as mp
import os
import shutil
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import espeakng_loader
import numpy as np
import soundfile as sf
from rich.console import Console
from rich.progress import MofNCompleteColumn, Progress, TimeElapsedColumn

from asr.cli import command
from asr.demo.espeak import Espeak, TimedWord, postprocess, word_times
from asr.demo.plan import (
    ALL_PARTS,
    PARTS,
    TEST_ONLY_SPEAKER,
    TRAIN_SPEAKERS,
    UNLABELLED_PART,
    UNLABELLED_SPEAKERS,
    Speaker,
    Utterance,
    plan_corpus,
)
from asr.frames import SAMPLE_RATE

MARKER = "demo_corpus.json"
_VERSION = 2  # bump when the generator changes, so old corpora are rebuilt (2: word times)
_CHUNK = 16  # utterances per worker process (see _synthesize_chunk)


# ---------------------------------------------------------------------------------------
# Audio


def _synthesize_chunk(
    job: tuple[list[tuple[Path, Utterance]], int, float],
) -> list[tuple[str, float, list[TimedWord]]]:
    """Worker: synthesize utterances in order and write their FLACs. Returns
    (id, seconds, word times) per utterance.

    Runs in a fresh process (a Pool with maxtasksperchild=1) because espeak-ng keeps state
    that no API call resets, not even espeak_Terminate + espeak_Initialize (for example the
    pitch-flutter index, a static variable in wavegen.c): samples depend on what the process
    synthesized before, and the same call twice in a row gives different samples and lengths,
    whatever the random seed. Chunks are fixed by the plan, so the output does not depend
    on num_jobs.
    """
    import torch

    torch.set_num_threads(1)  # one process per core already; also safe after fork
    chunk, seed, noise_dbfs = job
    engine = Espeak()
    done = []
    for path, utt in chunk:
        rng = np.random.default_rng([seed, ALL_PARTS.index(utt.part), utt.index])
        kwargs = {"rate": utt.rate, "pitch": utt.pitch, "pitch_range": utt.speaker.range}
        speech = engine.synthesize(
            utt.text, utt.speaker.voice, **kwargs, seed=int(rng.integers(2**31))
        )
        try:
            audio, offset = postprocess(speech.samples, speech.sample_rate, rng, noise_dbfs)
            seconds = len(audio) / SAMPLE_RATE
            # the unlabelled part has no transcripts, so no word times to get right
            unlabelled = utt.part == UNLABELLED_PART
            words = [] if unlabelled else word_times(utt.text, speech, offset, seconds)
        except ValueError as err:
            raise RuntimeError(f"{utt.id} ({utt.speaker.voice}, {utt.text!r}): {err}") from err
        sf.write(path, audio, SAMPLE_RATE, format="FLAC", subtype="PCM_16")
        done.append((utt.id, seconds, words))
    return done


# ---------------------------------------------------------------------------------------
# Corpus


def check_voices(speakers: Sequence[Speaker]) -> None:
    """Raise FileNotFoundError if a speaker's voice or variant is missing from espeak-ng-data.

    espeak_SetVoiceByName silently ignores an unknown variant, hence this check."""
    data = Path(espeakng_loader.get_data_path())
    languages = {path.name.lower() for path in (data / "lang").rglob("*") if path.is_file()}
    variants = {path.name for path in (data / "voices" / "!v").iterdir()}
    for speaker in speakers:
        language, _, variant = speaker.voice.partition("+")
        if language.lower() not in languages:
            english = sorted(name for name in languages if name.startswith("en"))
            raise FileNotFoundError(
                f"speaker {speaker.id}: espeak-ng voice {language!r} not found under "
                f"{data / 'lang'}; English voices there: {', '.join(english)}"
            )
        if variant and variant not in variants:
            raise FileNotFoundError(
                f"speaker {speaker.id}: espeak-ng variant {variant!r} not found in "
                f"{data / 'voices' / '!v'}; variants there: {', '.join(sorted(variants))}"
            )


def write_json(path: Path, content: dict) -> None:
    """`content` as indented JSON in `path`, written whole or not at all (a temporary
    file, then a rename)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(content, indent=2) + "\n")
    tmp.replace(path)


def _prepare_output(root: Path, params: dict) -> dict | None:
    """The summary of an existing complete corpus with `params`, or None after clearing
    what an earlier, different or interrupted run of ours left behind (the context sets of
    `asr.demo.context_sets` too: they are made from the training text it replaces)."""
    marker = root / MARKER
    try:
        previous = json.loads(marker.read_text())
    except (OSError, ValueError):
        previous = {}
    if previous.get("params") == params and "summary" in previous:
        return previous["summary"]
    existing = [root / part for part in ALL_PARTS if (root / part).exists()]
    if existing and not previous:
        raise FileExistsError(
            f"{existing[0]} exists but was not written by make_demo_corpus (no {MARKER}); "
            "remove it or choose another output directory"
        )
    if existing:
        Console(stderr=True).print(f"{root}: replacing an unfinished or different demo corpus")
    try:
        for folder in existing:
            shutil.rmtree(folder)
        root.mkdir(parents=True, exist_ok=True)
        write_json(marker, {"params": params})  # no summary yet: marks an unfinished run
    except OSError as err:
        raise OSError(f"cannot write the demo corpus to {root}: {err}") from err
    return None


def synthesize_all(
    root: Path, plan: dict[str, list[Utterance]], seed: int, noise_dbfs: float, num_jobs: int
) -> tuple[dict[str, float], dict[str, list[TimedWord]]]:
    """Synthesize every utterance of `plan`: (seconds, word times) by utterance id."""
    chunks = []
    for utterances in plan.values():
        for start in range(0, len(utterances), _CHUNK):
            chunk = []
            for utt in utterances[start : start + _CHUNK]:
                folder = root / utt.part / str(utt.speaker.id) / str(utt.chapter)
                folder.mkdir(parents=True, exist_ok=True)
                chunk.append((folder / f"{utt.id}.flac", utt))
            chunks.append((chunk, seed, noise_dbfs))
    # Import torch once here so that forked workers (one per chunk) inherit it.
    import torchaudio.functional  # noqa: F401

    context = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else None)
    progress = Progress(*Progress.get_default_columns(), MofNCompleteColumn(), TimeElapsedColumn())
    durations: dict[str, float] = {}
    words: dict[str, list[TimedWord]] = {}
    with context.Pool(num_jobs, maxtasksperchild=1) as pool, progress:
        task = progress.add_task(f"espeak-ng x{num_jobs}", total=sum(map(len, plan.values())))
        for done in pool.imap_unordered(_synthesize_chunk, chunks):
            for utt_id, seconds, timed in done:
                durations[utt_id], words[utt_id] = seconds, timed
            progress.advance(task, len(done))
    return durations, words


def write_transcripts(
    root: Path, utterances: list[Utterance], durations: dict[str, float], words: dict
) -> None:
    """Per chapter, `<spk>-<chapter>.trans.txt` and the word times in
    `<spk>-<chapter>.alignment.txt`, the format of the LibriSpeech alignments that lhotse
    reads (`alignment_line`)."""
    chapters: dict[Path, list[Utterance]] = defaultdict(list)
    for utt in utterances:
        chapters[root / utt.part / str(utt.speaker.id) / str(utt.chapter)].append(utt)
    for folder, utts in chapters.items():
        utts = sorted(utts, key=lambda u: u.number)
        stem = f"{folder.parent.name}-{folder.name}"
        (folder / f"{stem}.trans.txt").write_text("".join(f"{u.id} {u.transcript}\n" for u in utts))
        lines = [alignment_line(u.id, words[u.id], durations[u.id]) for u in utts]
        (folder / f"{stem}.alignment.txt").write_text("".join(lines))


def alignment_line(utt_id: str, words: list[TimedWord], duration: float) -> str:
    """One line of a LibriSpeech alignment file (github.com/CorentinJ/librispeech-alignments):
    `ID ",W1,W2," "e0,e1,e2,e3"`, the words upper case with an empty word for the silence
    before the first and after the last, and the end time of each, in seconds."""
    symbols = ["", *(w.word.upper() for w in words), ""]
    ends = [words[0].start if words else 0.0, *(w.end for w in words)]
    ends.append(max(ends[-1], math.floor(duration * 1000) / 1000))
    times = ",".join(f"{t:.3f}" for t in ends)
    return f'{utt_id} "{",".join(symbols)}" "{times}"\n'


def make_demo_corpus(
    out_dir: Path,
    *,
    train_hours: float = 2.0,
    dev_minutes: float = 6,
    test_minutes: float = 10,
    seed: int = 0,
    num_jobs: int | None = None,
    noise_dbfs: float = -65.0,
    librispeech_parts: bool = False,
    unlabelled_hours: float = 0.0,
) -> dict:
    """Write OUT/LibriSpeech/{train-clean-100,dev-clean,test-clean} and return a summary:
    utterances and hours per part, voices, vocabulary size, mean utterance seconds. With
    `librispeech_parts`, also train-clean-360, train-other-500, dev-other and test-other
    (the same voices and noise: LibriSpeech's names and layout, not its acoustics), for
    testing the LibriSpeech recipe. With `unlabelled_hours`, also train-unlabelled: that
    much audio without transcripts (new sentences, new voice settings) for self-supervised
    pre-training; its manifest comes from `asr.data.corpus.prepare_unlabelled`. It has its
    own marker in its folder: it is added to (or resized beside) an existing corpus without
    touching the labelled parts, and kept when a later call does not ask for it.

    Skips the work if OUT already holds a complete corpus made with the same parameters
    (the summary then has "reused": True). Same seed, same texts and samples, whatever
    `num_jobs` (default: os.cpu_count()).
    """
    if min(train_hours, dev_minutes, test_minutes) <= 0 or seed < 0:
        raise ValueError("train_hours, dev_minutes and test_minutes must be > 0 and seed >= 0")
    num_jobs = num_jobs or os.cpu_count() or 1
    root = Path(out_dir) / "LibriSpeech"
    sizes = {"train_hours": train_hours, "dev_minutes": dev_minutes, "test_minutes": test_minutes}
    params = {"version": _VERSION, **sizes, "seed": seed, "noise_dbfs": noise_dbfs}
    if librispeech_parts:  # only then: the demo's own corpora keep their marker
        params["librispeech_parts"] = True
    if unlabelled_hours < 0:
        raise ValueError(f"unlabelled_hours must be >= 0, got {unlabelled_hours}")
    summary = _prepare_output(root, params)
    reused = summary is not None
    if summary is not None:
        Console(stderr=True).print(
            f"{root}: complete demo corpus with these parameters exists; skipping"
        )
    else:
        check_voices((*TRAIN_SPEAKERS, TEST_ONLY_SPEAKER))
        plan = plan_corpus(**sizes, seed=seed, librispeech_parts=librispeech_parts)
        durations, words = synthesize_all(root, plan, seed, noise_dbfs, num_jobs)
        for utterances in plan.values():
            write_transcripts(root, utterances, durations, words)
        summary = _summary(plan, durations)
        write_json(root / MARKER, {"params": params, "summary": summary})
    if unlabelled_hours > 0:
        unlabelled = _unlabelled_part(
            root, params, sizes, librispeech_parts, unlabelled_hours, num_jobs
        )
        reused = reused and unlabelled is None
        summary = _with_unlabelled(root, summary)
    elif (root / UNLABELLED_PART / MARKER).is_file():  # made earlier: kept, and counted
        summary = _with_unlabelled(root, summary)
    return {**summary, "reused": reused}


def add_unlabelled_part(out_dir: str | Path, hours: float, num_jobs: int | None = None) -> dict:
    """Add (or resize) the unlabelled part of `make_demo_corpus` beside the complete demo
    corpus already in OUT, with that corpus's parameters, whatever they were; returns the
    corpus's summary. Raises FileNotFoundError naming OUT when it holds no complete corpus."""
    if hours <= 0:
        raise ValueError(f"unlabelled_hours must be > 0 to add the part, got {hours}")
    root = Path(out_dir) / "LibriSpeech"
    try:
        made = json.loads((root / MARKER).read_text())
        params, summary = made["params"], made["summary"]
    except (OSError, ValueError, KeyError) as err:
        raise FileNotFoundError(
            f"{root}: no complete demo corpus to add the unlabelled part to ({err}); "
            "make one first (asr-make-demo-corpus OUT)"
        ) from err
    sizes = {key: params[key] for key in ("train_hours", "dev_minutes", "test_minutes")}
    librispeech_parts = bool(params.get("librispeech_parts"))
    num_jobs = num_jobs or os.cpu_count() or 1
    made_now = _unlabelled_part(root, params, sizes, librispeech_parts, hours, num_jobs)
    return {**_with_unlabelled(root, summary), "reused": made_now is None}


def _summary(plan: dict[str, list[Utterance]], durations: dict[str, float]) -> dict:
    speakers = {utt.speaker for utterances in plan.values() for utt in utterances}
    hours = {part: sum(durations[utt.id] for utt in utts) / 3600 for part, utts in plan.items()}
    return {
        "parts": {
            part: {"utterances": len(plan[part]), "hours": round(hours[part], 4)} for part in plan
        },
        "voices": len(speakers),
        "voice_names": sorted(s.voice for s in speakers),
        "vocabulary": len({word for utt in plan.get(PARTS[0], []) for word in utt.text.split()}),
        "mean_utterance_seconds": round(sum(durations.values()) / len(durations), 3),
    }


def _unlabelled_part(
    root: Path,
    params: dict,
    sizes: dict,
    librispeech_parts: bool,
    hours: float,
    num_jobs: int,
) -> dict | None:
    """Synthesize `UNLABELLED_PART` beside the labelled parts of `params` (which it never
    touches), unless it exists with these parameters; its own marker in its folder. Returns
    its summary when it was made, None when it was reused."""
    folder = root / UNLABELLED_PART
    own = {"labelled": params, "unlabelled_hours": hours}
    try:
        previous = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        previous = {}
    if previous.get("params") == own and "summary" in previous:
        Console(stderr=True).print(f"{folder}: exists with these parameters; skipping")
        return None
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    check_voices(UNLABELLED_SPEAKERS)
    plan = plan_corpus(
        **sizes, seed=params["seed"], librispeech_parts=librispeech_parts, unlabelled_hours=hours
    )
    part = {UNLABELLED_PART: plan[UNLABELLED_PART]}
    durations, _ = synthesize_all(root, part, params["seed"], params["noise_dbfs"], num_jobs)
    summary = _summary(part, durations)
    write_json(folder / MARKER, {"params": own, "summary": summary})
    return summary


def _with_unlabelled(root: Path, summary: dict) -> dict:
    """`summary` with the unlabelled part's utterances and hours, and its voices."""
    unlabelled = json.loads((root / UNLABELLED_PART / MARKER).read_text())["summary"]
    names = sorted({*summary["voice_names"], *unlabelled["voice_names"]})
    return {
        **summary,
        "parts": {**summary["parts"], **unlabelled["parts"]},
        "voices": len(names),
        "voice_names": names,
    }


@command
def main(argv: Sequence[str] | None = None) -> None:
    """Console script `asr-make-demo-corpus OUT [--train-hours H] ...`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output directory (LibriSpeech/ is created inside)")
    parser.add_argument("--train-hours", type=float, default=2.0)
    parser.add_argument("--dev-minutes", type=float, default=6)
    parser.add_argument("--test-minutes", type=float, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-jobs", type=int, default=None, help="processes (default: all cores)")
    parser.add_argument(
        "--librispeech-parts",
        action="store_true",
        help="all seven LibriSpeech part names (a stand-in for testing its recipe)",
    )
    parser.add_argument(
        "--unlabelled-hours", type=float, default=0.0,
        help="also train-unlabelled: this much audio without transcripts (new sentences and "
        "voice settings) for self-supervised pre-training",
    )  # fmt: skip
    parser.add_argument(
        "--add-to-existing", action="store_true",
        help="with --unlabelled-hours: add the part beside the corpus already in OUT, with "
        "that corpus's parameters (the size and seed options are then ignored)",
    )  # fmt: skip
    args = vars(parser.parse_args(argv))
    if args.pop("add_to_existing"):
        summary = add_unlabelled_part(args["out"], args["unlabelled_hours"], args["num_jobs"])
    else:
        summary = make_demo_corpus(args.pop("out"), **args)
    for part, figures in summary["parts"].items():
        print(f"{part:16s} {figures['utterances']:6d} utterances {figures['hours']:8.3f} h")
    print(f"voices ({summary['voices']}): {', '.join(summary['voice_names'])}")
    print(f"training vocabulary: {summary['vocabulary']} words")
    print(f"mean utterance: {summary['mean_utterance_seconds']:.2f} s")


if __name__ == "__main__":
    main()
