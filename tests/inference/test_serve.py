"""asr-serve over real sockets: uvicorn serving the app on 127.0.0.1 in a thread, clients
from the `websockets` package, the tiny streaming model of conftest.py. The finals equal
what the streaming recognizer gives the same audio; bad input gets one error and a closed
connection while the other streams' texts stay the same."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import uvicorn
import websockets

from asr.decoding.fusion import LmFusion
from asr.inference.audio import read_audio
from asr.inference.endpoint import EndpointRules
from asr.inference.server import ServeConfig, create_app
from asr.inference.streaming import StreamingRecognizer, load_streaming_recognizer

pytestmark = pytest.mark.slow  # a tiny model trained, servers started

PIECE = 1600
NO_ENDPOINTS = EndpointRules(1000.0, 1000.0, 1000.0)  # one segment per stream


@pytest.fixture(scope="module")
def recognizer(streaming_run: Path) -> StreamingRecognizer:
    return load_streaming_recognizer(streaming_run, 160)


@pytest.fixture(scope="module")
def audio(test_flacs: list[Path]) -> list[np.ndarray]:
    return [read_audio(f) for f in test_flacs[:4]]


@contextlib.contextmanager
def serving(
    recognizer: StreamingRecognizer,
    config: ServeConfig,
    example: Path | None = None,
    lm: LmFusion | None = None,
) -> Iterator[str]:
    """The app on a free port of 127.0.0.1 -> its base URL (http://...); `lm`: the language
    model every connection fuses."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(recognizer, config, example, lm), "127.0.0.1", port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def status(base: str) -> dict:
    with urllib.request.urlopen(f"{base}/status", timeout=10) as response:
        return json.load(response)


async def stream(
    base: str,
    samples: np.ndarray,
    fmt: str = "f32le",
    pace: float = 0.0,
    context: list[str] | None = None,
) -> list[dict]:
    """Send `samples` in 0.1 s pieces (`pace` seconds apart), then end -> every message;
    `context`: the connection's phrases to boost."""
    async with websockets.connect(base.replace("http", "ws") + "/ws") as ws:
        messages = [json.loads(await ws.recv())]
        assert messages[0]["type"] == "ready"
        if fmt != "f32le" or context is not None:
            start = {"type": "start", "sample_rate": 16000, "format": fmt}
            await ws.send(json.dumps(start | ({} if context is None else {"context": context})))
        for at in range(0, len(samples), PIECE):
            piece = samples[at : at + PIECE]
            if fmt == "s16le":
                data = (np.clip(piece, -1, 1) * 32767).astype("<i2").tobytes()
            else:
                data = piece.astype("<f4").tobytes()
            await ws.send(data)
            await asyncio.sleep(pace)
        await ws.send(json.dumps({"type": "end"}))
        messages += [json.loads(m) async for m in ws]
        assert ws.close_code == 1000
    return messages


def final_text(messages: list[dict]) -> str:
    return " ".join(m["text"] for m in messages if m["type"] == "final").strip()


async def misbehave(base: str, *sends: bytes | str) -> tuple[list[dict], int | None]:
    """Send `sends` after the ready message -> what the server answered, its close code."""
    async with websockets.connect(base.replace("http", "ws") + "/ws") as ws:
        messages = [json.loads(await ws.recv())]
        with contextlib.suppress(websockets.ConnectionClosed):
            for data in sends:
                await ws.send(data)
            while True:  # `async for` would drop what came before a close with an error code
                messages.append(json.loads(await ws.recv()))
        return messages, ws.close_code


def test_concurrent_streams_get_the_recognizers_text_with_partials_and_word_times(
    recognizer, audio
):
    expected = [t.text for t in recognizer.transcribe(audio)]
    with serving(recognizer, ServeConfig(endpoints=NO_ENDPOINTS)) as base:

        async def everyone() -> list[list[dict]]:
            # the second asks to boost an empty list of phrases: the same text
            contexts = [None, [], None, None]
            formats = ["f32le", "f32le", "f32le", "s16le"]
            return await asyncio.gather(
                *(
                    stream(base, a, fmt, context=c)
                    for a, fmt, c in zip(audio, formats, contexts, strict=True)
                )
            )

        results = asyncio.run(everyone())
        served = status(base)
    for messages, text, samples in zip(results, expected, audio, strict=True):
        kinds = [m["type"] for m in messages]
        assert kinds[0] == "ready" and kinds[-1] == "end" and "partial" in kinds
        assert final_text(messages) == text
        partials = [m["audio_s"] for m in messages if m["type"] == "partial"]
        assert partials == sorted(partials) and partials[-1] == round(len(samples) / 16000, 3)
        (final,) = [m for m in messages if m["type"] == "final"]
        assert final["segment"] == 0 and " ".join(w["word"] for w in final["words"]) == text
        times = [t for w in final["words"] for t in (w["start"], w["end"])]
        assert all(0.0 <= w["confidence"] <= 1.0 for w in final["words"])
        # a token may come in the silence that ends the stream (Stream.finish)
        assert times == sorted(times)
        assert times[-1] <= len(samples) / 16000 + recognizer.tail_seconds
    # the streams shared model steps: fewer decode rounds than the chunks they decoded
    chunks = sum(-(-len(a) // (16000 * recognizer.chunk_seconds)) for a in audio)
    assert served["streams"] == 0 and served["batches"] < chunks


def test_a_tdt_model_is_served_with_the_text_it_decodes(streaming_tdt_run, audio):
    """A token-and-duration transducer streams through asr-serve as through its recognizer:
    the same finals, words in order (durations that jump past a chunk carry over)."""
    tdt = load_streaming_recognizer(streaming_tdt_run, 160)
    assert tdt.model.durations == (0, 1, 2, 3, 4)
    expected = [t.text for t in tdt.transcribe(audio[:2])]
    assert all(expected)
    with serving(tdt, ServeConfig(endpoints=NO_ENDPOINTS)) as base:

        async def both() -> list[list[dict]]:
            return await asyncio.gather(*(stream(base, a, "f32le") for a in audio[:2]))

        results = asyncio.run(both())
    for messages, text in zip(results, expected, strict=True):
        assert final_text(messages) == text
        (final,) = [m for m in messages if m["type"] == "final"]
        times = [t for w in final["words"] for t in (w["start"], w["end"])]
        assert times == sorted(times)


def test_a_segment_ends_at_the_longest_length_and_the_next_continues_the_stream(recognizer, audio):
    samples = np.concatenate([audio[0], audio[1]])
    rules = EndpointRules(1000.0, 1000.0, max_segment_s=1.0)
    with serving(recognizer, ServeConfig(endpoints=rules)) as base:
        messages = asyncio.run(stream(base, samples))
    finals = [m for m in messages if m["type"] == "final"]
    assert len(finals) >= 2
    assert [m["segment"] for m in finals] == list(range(len(finals)))
    starts = [m["start"] for m in finals]
    assert starts == sorted(starts)
    assert finals[-1]["end"] <= len(samples) / 16000 + recognizer.tail_seconds
    for m in finals:  # each segment's words lie in it
        assert all(m["start"] <= w["start"] <= w["end"] <= m["end"] for w in m["words"])


def test_bad_input_gets_one_error_and_the_other_streams_go_on(recognizer, audio):
    expected = recognizer.transcribe([audio[0]])[0].text
    config = ServeConfig(max_streams=3, max_frame_bytes=8000, endpoints=NO_ENDPOINTS)
    with serving(recognizer, config) as base:

        async def scenario() -> tuple[list[dict], list[tuple[list[dict], int | None]]]:
            good = asyncio.create_task(stream(base, audio[0], pace=0.02))
            await asyncio.sleep(0.3)  # the good stream is live
            bad = [
                await misbehave(base, json.dumps({"type": "start", "sample_rate": 44100})),
                await misbehave(base, "hello"),
                await misbehave(base, b"\x00" * 8004),
                await misbehave(
                    base, json.dumps({"type": "start", "format": "s16le"}), b"\x00" * 3
                ),
                await misbehave(base, json.dumps({"type": "start", "format": "mp3"})),
                await misbehave(base, json.dumps({"type": "start", "context": "ZORVAK"})),
                await misbehave(base, json.dumps({"type": "start", "context": ["CAFÉ"]})),
                await misbehave(
                    base,
                    json.dumps({"type": "start", "context": ["ZORVAK"], "context_score": 1e308}),
                ),
                await misbehave(base, json.dumps({"type": "start", "context": ["ZORVAK :51"]})),
            ]
            return await good, bad

        good, bad = asyncio.run(scenario())
        assert status(base)["streams"] == 0
    assert final_text(good) == expected
    errors = [(messages[-1], code) for messages, code in bad]
    assert all(m["type"] == "error" for m, _ in errors), errors
    texts = [m["message"] for m, _ in errors]
    assert "sample_rate 44100 is not served" in texts[0]
    assert "got text 'hello'" in texts[1]
    assert "8004 bytes is over the limit of 8000" in texts[2] and errors[2][1] == 1009
    assert "3 bytes is not a whole number of s16le samples" in texts[3]
    assert "format 'mp3' is not served" in texts[4]
    assert '"context" must be a list of phrases' in texts[5]
    assert "biasing phrase 'CAFÉ' cannot be tokenized" in texts[6]
    # the bound on the bonus per token (MAX_BIASING_SCORE): 1e308 overflowed float32
    assert texts[7].startswith('"context_score" must be >= 0 and at most 50 per token')
    assert texts[7].endswith("got 1e+308")
    assert "biasing score of 'ZORVAK' must be >= 0 and at most 50" in texts[8]
    assert all(code == 1008 for i, (_, code) in enumerate(errors) if i != 2)


async def timed_messages(
    base: str, samples: np.ndarray, pace: float, until: asyncio.Event
) -> list[tuple[float, dict]]:
    """Stream `samples` in 0.1 s pieces `pace` seconds apart, over and over until `until`
    is set -> each message with the time it arrived (read as they come)."""
    async with websockets.connect(base.replace("http", "ws") + "/ws") as ws:
        got: list[tuple[float, dict]] = []

        async def read() -> None:
            async for message in ws:
                got.append((time.monotonic(), json.loads(message)))

        reader = asyncio.create_task(read())
        while not until.is_set():
            for at in range(0, len(samples), PIECE):
                await ws.send(samples[at : at + PIECE].astype("<f4").tobytes())
                await asyncio.sleep(pace)
        await ws.send(json.dumps({"type": "end"}))
        await reader
    return got


def test_equal_phrase_lists_share_one_graph_built_off_the_event_loop(
    recognizer, audio, monkeypatch
):
    """8 connections send the same 1,000 phrases: one graph is built (on its own thread,
    slowed here by a second so that it shows), and a stream without phrases keeps getting
    its partials meanwhile; the 8 get the same text."""
    from asr.decoding import biasing

    letters = "ABCDEFGHIJKLMNOPRSTUVWY"
    phrases = [f"{a}{b}{c}OR {c}{a}N" for a in letters[:10] for b in letters for c in "AEIOU"]
    phrases = phrases[:1000]
    assert len(set(phrases)) == 1000
    build = biasing.BiasingGraph.from_phrases
    window: list[float] = []

    def slow_build(*args, **kwargs):
        window.append(time.monotonic())
        time.sleep(1.0)
        graph = build(*args, **kwargs)
        window.append(time.monotonic())
        return graph

    monkeypatch.setattr(biasing.BiasingGraph, "from_phrases", slow_build)
    builds = recognizer.biasing_graphs.builds
    with serving(recognizer, ServeConfig(endpoints=NO_ENDPOINTS)) as base:

        async def scenario() -> tuple[list[tuple[float, dict]], list[list[dict]]]:
            built = asyncio.Event()  # the plain stream goes on until the 8 are done
            plain = asyncio.create_task(timed_messages(base, audio[0], 0.05, built))
            await asyncio.sleep(0.3)
            boosted = [stream(base, audio[1][:32000], context=phrases) for _ in range(8)]
            finished = await asyncio.gather(*boosted)
            built.set()
            return await plain, finished

        plain, boosted = asyncio.run(scenario())
    assert recognizer.biasing_graphs.builds == builds + 1 and len(window) == 2
    during = [m for at, m in plain if window[0] <= at <= window[1] and m["type"] == "partial"]
    assert len(during) >= 3, (window, [at for at, _ in plain])
    texts = {final_text(messages) for messages in boosted}
    assert len(texts) == 1


def test_full_vanished_and_idle_connections(recognizer, audio):
    expected = recognizer.transcribe([audio[1]])[0].text
    config = ServeConfig(max_streams=101, idle_timeout_s=1.5, endpoints=NO_ENDPOINTS)
    with serving(recognizer, config) as base:

        async def scenario() -> tuple[list[dict], list[tuple[list[dict], int | None]]]:
            # a client that vanishes mid-utterance: its stream is freed
            ws = await websockets.connect(base.replace("http", "ws") + "/ws")
            await ws.recv()
            await ws.send(audio[0][:8000].astype("<f4").tobytes())
            await asyncio.sleep(0.3)
            ws.transport.abort()  # no closing handshake: the TCP connection just drops
            good = asyncio.create_task(stream(base, audio[1], pace=0.02))
            idle = await asyncio.gather(*(misbehave(base) for _ in range(100)))
            return await good, idle

        good, idle = asyncio.run(scenario())
        assert status(base)["streams"] == 0
        # more connections than --max-streams: the one over is refused
        with serving(recognizer, ServeConfig(max_streams=1)) as small:

            async def full() -> tuple[list[dict], int | None]:
                async with websockets.connect(small.replace("http", "ws") + "/ws") as first:
                    await first.recv()
                    return await misbehave(small)

            refused, code = asyncio.run(full())
    assert final_text(good) == expected
    assert all(
        m[-1]["type"] == "error" and "no data for 1.5 s" in m[-1]["message"] for m, _ in idle
    )
    assert (
        refused[-1]["type"] == "error" and "the server is full (1 streams" in refused[-1]["message"]
    )
    assert code == 1013


def test_endpoints_follow_the_models_blank_frames(streaming_run, audio):
    """Speech, then frames the model hears as silence (its blank made certain by raising
    the joiner's blank bias: real decoding of real audio, only the verdict forced): the
    segment ends `silence_after_speech_s` after its last token, with a final; a segment
    without words restarts after `silence_s`, without one."""
    from asr.inference.server import Connection

    recognizer = load_streaming_recognizer(streaming_run, 160)
    bias = recognizer.model.joiner.output.bias
    blank = recognizer.model.blank_id
    rules = EndpointRules(silence_after_speech_s=0.8, silence_s=1.6, max_segment_s=1000.0)
    connection = Connection(recognizer, rules)
    connection.open_stream()
    chunk = round(recognizer.chunk_seconds * 16000)

    def run(samples: np.ndarray) -> list[dict]:
        messages = []
        for at in range(0, len(samples), chunk):
            connection.feed([samples[at : at + chunk]], finish=False)
            while recognizer.decode_round([connection.stream]):
                messages += connection.results()
        return messages

    speech = run(audio[0][: 2 * 16000])  # tokens: the tiny model emits on every chunk
    assert not [m for m in speech if m["type"] == "final"]
    spoken_until = speech[-1]["audio_s"]
    with torch.no_grad():
        bias[blank] += 1000.0  # from here on, every frame is silent to the model
    silent = run(audio[1][: 4 * 16000])
    finals = [m for m in silent if m["type"] == "final"]
    assert len(finals) == 1 and finals[0]["segment"] == 0 and finals[0]["text"]
    closed_at = next(m["audio_s"] for m in silent if m["type"] == "final")
    # the endpoint comes on the first chunk after 0.8 s of silent frames
    assert 0.8 <= closed_at - finals[0]["end"] < 0.8 + recognizer.chunk_seconds + 0.05
    assert finals[0]["end"] <= spoken_until + 0.05
    later = [m for m in silent if m["audio_s"] > closed_at]
    assert later and all(m["type"] == "partial" and m["segment"] == 1 for m in later)
    assert all(m["text"] == "" for m in later)
    # 4 s of silence: segment 1 (no words) restarted after 1.6 s, and again, silently
    assert connection.segment == 1
    stream = connection.stream
    segment_start = stream.decoding.search_start
    assert segment_start * recognizer.model.frame_seconds >= closed_at + 1.6


@pytest.mark.long  # four processes that each load torch: 45 s
def test_the_command_serves_as_typed_and_refuses_in_one_line(
    streaming_run, trained_run, recognizer, audio, cli
):
    def error(*args) -> str:
        done = subprocess.run(
            cli.command("asr-serve", *args), capture_output=True, text=True, env=cli.env
        )
        assert done.returncode != 0
        return done.stderr.strip()

    assert error(trained_run.checkpoints / "last.ckpt") == (
        "asr-serve: error: this model was trained with full context "
        "(model.encoder.streaming is null): it cannot stream"
    )
    assert error(streaming_run, "--chunk-ms", "200") == (
        "asr-serve: error: --chunk-ms 200 was not trained; trained chunks: 80, 160 ms"
    )
    assert error(streaming_run, "--max-streams", "0") == (
        "asr-serve: error: --max-streams must be at least 1, got 0"
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        cli.command("asr-serve", streaming_run, "--chunk-ms", "160", "--port", str(port)),
        stderr=subprocess.PIPE,
        text=True,
        env=cli.env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                served = status(base)
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "no server"
                time.sleep(0.3)
        assert served["chunk_ms"] == 160 and served["max_streams"] == 32
        with urllib.request.urlopen(base, timeout=10) as page:
            assert b"Live transcription" in page.read()
        messages = asyncio.run(stream(base, audio[2]))
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=30)
    assert final_text(messages) == recognizer.transcribe([audio[2]])[0].text
    assert f"at http://127.0.0.1:{port}/ (websocket /ws), 160 ms chunks" in stderr
