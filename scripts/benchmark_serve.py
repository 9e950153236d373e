"""asr-serve under load, from 127.0.0.1: N concurrent clients each stream a different demo
test utterance at real time, and when it ends connect again with the next one, for
`--seconds`. Prints one JSON line per client count:

- `finals_equal`: utterances whose final text equals the streaming recognizer's for the same
  file (what `asr-transcribe --streaming` prints), of `utterances`;
- `latency_ms` p50/p95/max: from sending the piece that completed the chunk a partial
  result decoded (the first piece after which the server's feature frames reach its
  `audio_s`: a frame needs its whole 25 ms window, so a chunk that ends just at a piece's
  end waits for the next piece) to receiving that result;
- `chunk_compute_ms`: one stream's model step per chunk, measured alone in this process
  with the server's thread count: the target's yardstick (p95 at N=8 at most 2x it);
- `server_cpu_rtf`: the server process's CPU seconds (user + system) per second of audio;
- `rss_mib`: the server's resident memory at start (after the first round), at the end, the
  most, and its slope in MiB per 10 minutes (flat: the streams' state is freed).

    python scripts/benchmark_serve.py exp/demo_streaming/model.bundle.pt \\
        data/demo/manifests/librispeech_cuts_test-clean.jsonl.gz --clients 1,8,32 --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import torch
import websockets

from asr.data.corpus import load_cuts
from asr.data.features import OnlineFeatures
from asr.frames import FRAME_SHIFT_SECONDS
from asr.inference.streaming import StreamingRecognizer, load_streaming_recognizer

PIECE = 1600  # 0.1 s


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def percentile(values: list[float], q: float) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def frames_ready(recognizer: StreamingRecognizer, samples: np.ndarray) -> list[int]:
    """The feature frames ready after each `PIECE` of `samples`, as the server computes them."""
    features, ready = OnlineFeatures(recognizer.features), []
    for at in range(0, len(samples), PIECE):
        features.accept(samples[at : at + PIECE])
        ready.append(features.ready)
    return ready


async def one_utterance(
    url: str, samples: np.ndarray, ready: list[int], latencies: list[float]
) -> str:
    """Stream `samples` (`ready`: the frames ready after each piece) at real time -> the
    final text; each partial's latency appended."""
    sent: list[float] = []  # when each piece was sent
    async with websockets.connect(url, max_size=None) as ws:
        assert json.loads(await ws.recv())["type"] == "ready"

        async def send() -> None:
            began = time.perf_counter()
            for at in range(0, len(samples), PIECE):
                delay = began + at / 16000 - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                await ws.send(samples[at : at + PIECE].tobytes())
                sent.append(time.perf_counter())
            await ws.send(json.dumps({"type": "end"}))

        sender = asyncio.create_task(send())
        finals = []
        async for raw in ws:
            now = time.perf_counter()
            message = json.loads(raw)
            if message["type"] == "partial":
                frames = round(message["audio_s"] / FRAME_SHIFT_SECONDS)
                piece = next((i for i, n in enumerate(ready) if n >= frames), None)
                if piece is not None and piece < len(sent):  # not the end-of-stream padding
                    latencies.append((now - sent[piece]) * 1000)
            elif message["type"] == "final":
                finals.append(message["text"])
            elif message["type"] == "error":
                raise RuntimeError(message["message"])
        await sender
    return " ".join(finals).strip()


async def client(
    url: str,
    order: list[int],
    utterances: list[tuple[np.ndarray, list[int]]],
    until: float,
    latencies: list[float],
    texts: list[tuple[int, str]],
) -> None:
    """Connect, stream an utterance, connect again with the next, until `until`."""
    turn = 0
    while time.perf_counter() < until:
        index = order[turn % len(order)]
        samples, ready = utterances[index]
        texts.append((index, await one_utterance(url, samples, ready, latencies)))
        turn += 1


async def load(
    port: int,
    pid: int,
    count: int,
    seconds: float,
    utterances: list[tuple[np.ndarray, list[int]]],
    rss_every: float,
) -> tuple[list[float], list[tuple[int, str]], list[tuple[float, float]], float]:
    """`count` clients for `seconds` -> partial latencies (ms), (utterance, final text) per
    utterance streamed, (seconds, server RSS MiB) samples, and the wall seconds."""
    latencies: list[float] = []
    texts: list[tuple[int, str]] = []
    rss: list[tuple[float, float]] = []
    began = time.perf_counter()
    until = began + seconds

    async def sample_rss() -> None:
        while time.perf_counter() < until:
            rss.append((time.perf_counter() - began, rss_mib(pid)))
            await asyncio.sleep(rss_every)

    sampler = asyncio.create_task(sample_rss())
    n = len(utterances)
    orders = [[(i * 7 + k) % n for k in range(n)] for i in range(count)]
    url = f"ws://127.0.0.1:{port}/ws"
    await asyncio.gather(*(client(url, o, utterances, until, latencies, texts) for o in orders))
    await sampler
    return latencies, texts, rss, time.perf_counter() - began


def chunk_compute_ms(recognizer: StreamingRecognizer, audio: list[np.ndarray]) -> float:
    """One stream's model step per chunk, median, in this process."""
    times = []
    for samples in audio[:5]:
        stream = recognizer.create_stream()
        stream.accept_waveform(samples)
        stream.finish()
        while True:
            began = time.perf_counter()
            if not recognizer.decode_round([stream]):
                break
            times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("cuts", type=Path, help="a cut manifest of utterances to stream")
    parser.add_argument("--clients", default="1,8,32", help="client counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=60.0, help="per client count")
    parser.add_argument("--chunk-ms", type=float, default=None)
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    parser.add_argument(
        "--batch-wait-ms", type=float, default=None, help="the server's (default: its own)"
    )
    parser.add_argument("--rss-every", type=float, default=10.0, help="seconds between samples")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cuts = list(load_cuts(args.cuts))
    audio = [c.load_audio()[0].astype(np.float32) for c in cuts]
    recognizer = load_streaming_recognizer(args.model, args.chunk_ms)
    expected = [t.text for t in recognizer.transcribe(audio)]
    per_chunk = chunk_compute_ms(recognizer, audio)
    utterances = [(samples, frames_ready(recognizer, samples)) for samples in audio]
    port = free_port()
    command = [
        Path(sys.executable).with_name("asr-serve"),
        args.model,
        "--port",
        str(port),
        "--num-threads",
        str(args.threads),
        "--max-streams",
        "256",
    ]
    if args.chunk_ms is not None:
        command += ["--chunk-ms", str(args.chunk_ms)]
    if args.batch_wait_ms is not None:
        command += ["--batch-wait-ms", str(args.batch_wait_ms)]
    server = subprocess.Popen([str(c) for c in command], stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/status", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("asr-serve did not start") from None
                time.sleep(0.5)
        for count in [int(c) for c in args.clients.split(",")]:
            cpu_before = cpu_seconds(server.pid)
            latencies, texts, rss, wall = asyncio.run(
                load(port, server.pid, count, args.seconds, utterances, args.rss_every)
            )
            cpu = cpu_seconds(server.pid) - cpu_before
            streamed = sum(len(audio[i]) for i, _ in texts) / 16000
            later = [(t, r) for t, r in rss if t >= args.rss_every]  # after the first round
            slope = np.polyfit(*zip(*later, strict=True), 1)[0] if len(later) > 2 else 0.0
            print(
                json.dumps(
                    {
                        "clients": count,
                        "seconds": round(wall, 1),
                        "utterances": len(texts),
                        "finals_equal": sum(expected[i] == text for i, text in texts),
                        "audio_s": round(streamed, 1),
                        "latency_ms": {
                            "p50": round(percentile(latencies, 50), 1),
                            "p95": round(percentile(latencies, 95), 1),
                            "max": round(max(latencies), 1),
                            "partials": len(latencies),
                        },
                        "chunk_compute_ms": round(per_chunk, 1),
                        "p95_over_chunk_compute": round(percentile(latencies, 95) / per_chunk, 2),
                        "chunk_ms": round(recognizer.chunk_seconds * 1000),
                        "server_cpu_rtf": round(cpu / streamed, 4) if streamed else None,
                        "rss_mib": {
                            "start": round((later or rss)[0][1], 1) if rss else None,
                            "end": round(rss[-1][1], 1) if rss else None,
                            "max": round(max(r for _, r in rss), 1) if rss else None,
                            "slope_per_10min": round(float(slope) * 600, 2),
                        },
                        "threads": args.threads,
                        "batch_wait_ms": args.batch_wait_ms,
                    }
                ),
                flush=True,
            )
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
