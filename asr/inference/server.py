"""`asr-serve`: live transcription over a websocket, straight from a streaming model.

One process holds one `StreamingRecognizer`; each websocket connection is one `Stream` of
it. The connections are decoded together: one decoding task wakes when audio arrives,
waits at most `batch_wait_ms` for more, then feeds every connection's audio to its stream
and encodes every ready chunk of all of them in one batch per round
(`StreamingRecognizer.decode`), on a worker thread, so that the event loop keeps
receiving meanwhile. Starlette routes the websocket and serves the page (`web/`);
uvicorn runs it.

The protocol (docs/serving.md has an example exchange), at ``ws://HOST:PORT/ws``:

- the server says ``{"type": "ready", "sample_rate": 16000, "format": "f32le",
  "chunk_ms": ..., "left_context_ms": ..., "max_frame_bytes": ...}`` on connecting;
- the client may first send ``{"type": "start", "sample_rate": 16000, "format":
  "s16le"}`` (format ``f32le``, the default, or ``s16le``; only 16 kHz mono; optionally
  ``"context": ["PHRASE", "PHRASE :SCORE", ...]`` and ``"context_score": S``: biasing
  phrases, which this connection's search boosts, at most
  `ServeConfig.max_biasing_phrases`, and their bonus per token, 0 to
  `MAX_BIASING_SCORE`; the keys keep the protocol's first name, "context", for the
  clients already written), then binary frames of PCM in that format, then
  ``{"type": "end"}``;
- the server answers ``{"type": "partial", "segment": N, "text": ..., "audio_s": ...}``
  after each chunk it decodes (``audio_s``: the seconds of the stream decoded so far),
  ``{"type": "final", "segment": N, "text": ..., "start": ..., "end": ..., "words":
  [{"word", "start", "end", "confidence"}], "audio_s": ...}`` at each endpoint (times in seconds of
  the stream), and after ``end`` the last final (if any words) and ``{"type": "end"}``,
  then closes; a fault in the client's input gets ``{"type": "error", "message": ...}``
  and a closed connection, and no other connection notices.

Endpoints (`asr.inference.endpoint`, sherpa-onnx's rules and defaults) come from the
model's own blanks: a segment ends after `silence_after_speech_s` of encoder frames that
emitted nothing, once it has words; a segment without words is restarted after
`silence_s`; and any segment ends at `max_segment_s`. At an endpoint the search starts
again (the encoder keeps its left context), so that the next segment's words are not held
back by the last's.

With a language model (`asr-serve --lm`, `create_app(lm=...)`), one `LmFusion` is read at
start-up and every connection's search fuses that same object, after each endpoint too, so
that the streams still share search steps (`advance_each` groups them by graph and LM).

A start message's phrases are made into a biasing graph on a thread of their own, never on
the event loop or the decoding thread (1,000 phrases take a few tenths of a second), and
equal lists share one graph (`SharedBiasingGraphs`): the streams that ask for the same
phrases share one search step, as streams without phrases do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from asr.decoding.biasing import DEFAULT_BIASING_SCORE, BiasingGraph, check_biasing_score
from asr.decoding.fusion import LmFusion
from asr.decoding.hypotheses import TimedTokens
from asr.frames import FRAME_SHIFT_SECONDS, SAMPLE_RATE
from asr.inference.endpoint import Endpoint, EndpointRules, detect_endpoint
from asr.inference.streaming import Stream, StreamingRecognizer
from asr.inference.timestamps import words_of_hypothesis

log = logging.getLogger("asr.serve")

WEB_DIR = Path(__file__).with_name("web")
FORMATS = {"f32le": np.dtype("<f4"), "s16le": np.dtype("<i2")}

# websocket close codes (RFC 6455): the client's data was refused, too big, or the server
# is full; 1000 a normal end.
CLOSE_NORMAL, CLOSE_POLICY, CLOSE_TOO_BIG, CLOSE_TRY_LATER = 1000, 1008, 1009, 1013


@dataclass(frozen=True)
class ServeConfig:
    """How `asr-serve` runs:

    - `max_streams`: connections decoded at once; one more is refused with an error;
    - `batch_wait_ms`: how long the decoding task waits for more audio after the first
      piece arrives, so that the connections' chunks share one model step;
    - `max_frame_bytes`: the largest binary frame (a longer one is an error);
    - `idle_timeout_s`: a connection that sends nothing for this long is closed;
    - `endpoints`: `EndpointRules`;
    - `max_biasing_phrases`: the most phrases a connection may ask to boost."""

    max_streams: int = 32
    batch_wait_ms: float = 10.0
    max_frame_bytes: int = 2 * SAMPLE_RATE * 4  # 2 s of float32
    idle_timeout_s: float = 30.0
    endpoints: EndpointRules = field(default_factory=EndpointRules)
    max_biasing_phrases: int = 1000

    def __post_init__(self) -> None:
        if self.max_streams < 1:
            raise ValueError(f"--max-streams must be at least 1, got {self.max_streams}")
        if self.batch_wait_ms < 0 or self.idle_timeout_s <= 0 or self.max_frame_bytes < 4:
            raise ValueError(
                "--batch-wait-ms must be >= 0, --idle-timeout > 0 and --max-frame-bytes >= 4"
            )
        if self.max_biasing_phrases < 0:
            raise ValueError(f"--max-biasing-phrases must be >= 0, got {self.max_biasing_phrases}")


class ClientFault(ValueError):
    """What a client sent that the protocol refuses; its message goes to that client."""

    def __init__(self, message: str, code: int = CLOSE_POLICY) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class StartRequest:
    """A client's start message, checked: its PCM format and the biasing phrases it asks
    for (None: none) with their score."""

    format: str
    phrases: list[str] | None
    score: float


class Connection:
    """One client: audio received and not yet fed, its stream (opened by the start message,
    once its phrases are built, or by the first audio), the current segment's number, and
    the messages its decoded chunks produce."""

    def __init__(
        self,
        recognizer: StreamingRecognizer,
        rules: EndpointRules,
        max_phrases: int = 1000,
        lm: LmFusion | None = None,
    ) -> None:
        self.recognizer = recognizer
        self.rules = rules
        self.max_phrases = max_phrases
        self.lm = lm
        self.stream: Stream | None = None
        self.format = "f32le"
        self.started = False  # audio or a start message received: the format is fixed
        self.pending: list[np.ndarray] = []
        self.ending = False  # the client sent end
        self.segment = 0  # the current segment's number
        self.decoded_frames = 0  # encoder frames searched when results were last made
        self.outbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    def open_stream(self, biasing: BiasingGraph | None = None) -> None:
        """Start decoding, boosting `biasing`'s phrases and fusing the server's LM."""
        self.stream = self.recognizer.create_stream(biasing, lm=self.lm)

    # -- what the client sends ----------------------------------------------------------
    def control(self, text: str) -> StartRequest | None:
        """A text frame: a start message (-> what it asks for) or an end message."""
        try:
            message = json.loads(text)
        except json.JSONDecodeError:
            raise ClientFault(
                f"expected binary PCM or a JSON message, got text {text[:40]!r}"
            ) from None
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "start":
            return self._start(message)
        if kind == "end":
            self.ending = True
            if self.stream is None:
                self.open_stream()
            return None
        raise ClientFault(f'unknown message {text[:60]!r}: expected type "start" or "end"')

    def _start(self, message: dict[str, Any]) -> StartRequest:
        if self.started:
            raise ClientFault("start must come first, before any audio")
        rate = message.get("sample_rate", SAMPLE_RATE)
        if rate != SAMPLE_RATE:
            raise ClientFault(f"sample_rate {rate} is not served: send 16000 Hz mono")
        form = message.get("format", "f32le")
        if form not in FORMATS:
            raise ClientFault(f"format {form!r} is not served: f32le or s16le")
        phrases = message.get("context")
        if phrases is not None:
            if not isinstance(phrases, list) or not all(isinstance(p, str) for p in phrases):
                raise ClientFault('"context" must be a list of phrases (strings)')
            if len(phrases) > self.max_phrases:
                raise ClientFault(
                    f'{len(phrases)} biasing phrases ("context") is over the limit of '
                    f"{self.max_phrases}"
                )
        score = message.get("context_score", DEFAULT_BIASING_SCORE)
        if not isinstance(score, int | float) or isinstance(score, bool):
            raise ClientFault(f'"context_score" must be a number, got {score!r}')
        try:
            score = check_biasing_score(score, '"context_score"')
        except ValueError as err:  # e.g. 1e308, which float32 tables hold as inf
            raise ClientFault(str(err)) from None
        self.format = form
        self.started = True
        return StartRequest(form, phrases, float(score))

    def audio(self, data: bytes) -> None:
        """A binary frame of PCM."""
        if self.ending:
            raise ClientFault("audio after end")
        dtype = FORMATS[self.format]
        if len(data) % dtype.itemsize:
            raise ClientFault(
                f"{len(data)} bytes is not a whole number of {self.format} samples "
                f"({dtype.itemsize} bytes each)"
            )
        self.started = True
        if self.stream is None:
            self.open_stream()
        samples = np.frombuffer(data, dtype=dtype)
        if self.format == "s16le":
            samples = samples.astype(np.float32) / 32768.0
        elif not np.isfinite(samples).all():
            raise ClientFault("the audio holds NaN or infinite samples")
        self.pending.append(samples.astype(np.float32, copy=False))

    @property
    def has_work(self) -> bool:
        """Audio to feed, a chunk to encode, or an end to finish."""
        if self.stream is None:
            return False
        return (
            bool(self.pending)
            or self.stream.chunk_ready
            or (self.ending and not self.stream.finished)
        )

    # -- the decoding task's side (on the worker thread) --------------------------------
    def take_audio(self) -> tuple[list[np.ndarray], bool]:
        """The audio to feed and whether to finish, handed from the event loop."""
        pieces, self.pending = self.pending, []
        return pieces, self.ending

    def feed(self, pieces: list[np.ndarray], finish: bool) -> None:
        for piece in pieces:
            self.stream.accept_waveform(piece)
        if finish:
            self.stream.finish()

    # -- messages after a decode ----------------------------------------------------------
    def results(self) -> list[dict[str, Any]]:
        """The messages the chunks decoded since the last call produce: a partial per
        decode that consumed frames, a final at an endpoint or at the end of the stream."""
        stream = self.stream
        frames = stream.frames_decoded
        if frames == self.decoded_frames and not stream.done:
            return []
        self.decoded_frames = frames
        best = stream.best()
        text = self.recognizer.tokenizer.decode(best.tokens)
        messages = [self._message("partial", text)]
        frame_s = self.recognizer.model.frame_seconds
        segment_start = stream.decoding.search_start
        # where the last token ends: one frame on for a plain transducer's, a TDT's duration
        speech_end = best.frames[-1] + best.durations[-1] if best.frames else segment_start
        endpoint = detect_endpoint(
            self.rules,
            decoded_s=(frames - segment_start) * frame_s,
            trailing_silence_s=(frames - speech_end) * frame_s,
            has_words=bool(text.strip()),
            ended=stream.done,
        )
        if endpoint is Endpoint.FINAL:
            messages.append(self._final(text, best, segment_start))
            self.segment += 1
            self.recognizer.restart_search(stream)
        elif endpoint is Endpoint.RESTART:
            self.recognizer.restart_search(stream)
        if stream.done:
            messages.append({"type": "end", "audio_s": self._audio_s()})
        return messages

    def _audio_s(self) -> float:
        seconds = self.stream.encoded * FRAME_SHIFT_SECONDS
        return round(min(seconds, self.stream.samples / SAMPLE_RATE), 3)

    def _message(self, kind: str, text: str) -> dict[str, Any]:
        return {"type": kind, "segment": self.segment, "text": text, "audio_s": self._audio_s()}

    def _final(self, text: str, best: TimedTokens, segment_start: int) -> dict[str, Any]:
        recognizer = self.recognizer
        frame_s = recognizer.model.frame_seconds
        words = words_of_hypothesis(best, recognizer.tokenizer, frame_s, 0.0, self._audio_s())
        message = self._message("final", text)
        message["start"] = words[0].start if words else round(segment_start * frame_s, 3)
        message["end"] = words[-1].end if words else message["start"]
        message["words"] = [
            {"word": w.word, "start": w.start, "end": w.end, "confidence": w.confidence}
            for w in words
        ]
        return message


class LiveDecoder:
    """The decoding task: the live connections, decoded together in batched model steps
    on one worker thread, at most `batch_wait_ms` after the first audio waiting; `lm`: the
    language model every connection's search fuses (None: none)."""

    def __init__(
        self, recognizer: StreamingRecognizer, config: ServeConfig, lm: LmFusion | None = None
    ) -> None:
        self.recognizer = recognizer
        self.config = config
        self.lm = lm
        self.connections: set[Connection] = set()
        self._wake = asyncio.Event()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="asr-serve-decode")
        # Phrase lists are built on a thread of their own: the event loop and the decoding
        # thread go on meanwhile (a list of 1,000 phrases takes a few tenths of a second).
        self._phrases = ThreadPoolExecutor(1, thread_name_prefix="asr-serve-phrases")
        self._task: asyncio.Task | None = None
        self.batches = 0  # model steps' rounds taken (decode calls), for the logs and tests
        self.compute_s = 0.0  # time on the worker thread

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._worker.shutdown(wait=True)
        self._phrases.shutdown(wait=True)

    def open(self) -> Connection:
        if len(self.connections) >= self.config.max_streams:
            raise ClientFault(
                f"the server is full ({self.config.max_streams} streams, --max-streams): "
                "try again later",
                CLOSE_TRY_LATER,
            )
        connection = Connection(
            self.recognizer, self.config.endpoints, self.config.max_biasing_phrases, self.lm
        )
        self.connections.add(connection)
        return connection

    async def biasing_graph(self, phrases: list[str], score: float) -> BiasingGraph:
        """The graph of a start message's phrases, built off the event loop (or shared with
        the streams that asked for the same), or a ClientFault naming what is wrong."""
        loop = asyncio.get_running_loop()
        graphs = self.recognizer.biasing_graphs
        try:
            return await loop.run_in_executor(self._phrases, graphs.get, phrases, score)
        except ValueError as err:
            raise ClientFault(str(err)) from None

    def close(self, connection: Connection) -> None:
        """Forget `connection` (its stream's state is freed with it)."""
        self.connections.discard(connection)

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        wait = self.config.batch_wait_ms / 1000
        backlog = False
        while True:
            if not backlog:
                await self._wake.wait()
                self._wake.clear()
                if wait:
                    await asyncio.sleep(wait)
            ready = [c for c in self.connections if c.has_work]
            handed = [(c, *c.take_audio()) for c in ready]
            try:
                began = time.perf_counter()
                decoded = await loop.run_in_executor(self._worker, self._decode, handed)
                self.compute_s += time.perf_counter() - began
                self.batches += bool(decoded)
            except Exception:  # a bug, not a client's fault: the streams in the batch end
                log.exception("decoding failed; closing %d stream(s)", len(ready))
                for c in ready:
                    self._fail(c)
                decoded = []
            for c in decoded:
                if c not in self.connections:  # a client that left meanwhile gets nothing
                    continue
                try:
                    messages = c.results()
                except Exception:
                    log.exception("a stream's results failed; closing it")
                    self._fail(c)
                    continue
                for message in messages:
                    c.outbox.put_nowait(message)
                if c.stream.done:
                    c.outbox.put_nowait(None)
            backlog = any(c.has_work for c in self.connections)

    def _fail(self, connection: Connection) -> None:
        """End `connection` on a server fault: one error, then its end; the others go on."""
        connection.outbox.put_nowait({"type": "error", "message": "internal error"})
        connection.outbox.put_nowait(None)
        self.close(connection)

    def _decode(self, handed: list[tuple[Connection, list[np.ndarray], bool]]) -> list[Connection]:
        """Feed each connection its audio, then encode one chunk of each that has one ->
        those (a stream that ends with no audio is done at once: it is among them)."""
        for connection, pieces, finish in handed:
            connection.feed(pieces, finish)
        decoded = {id(s) for s in self.recognizer.decode_round([c.stream for c, _, _ in handed])}
        return [c for c, _, _ in handed if id(c.stream) in decoded or c.stream.done]


async def _send_outbox(websocket: WebSocket, connection: Connection) -> None:
    """Send `connection`'s messages in order until its None (the end)."""
    try:
        while (message := await connection.outbox.get()) is not None:
            await websocket.send_text(json.dumps(message))
        await websocket.close(CLOSE_NORMAL)
    except (RuntimeError, WebSocketDisconnect):  # the client left: nobody to tell
        pass


async def _refuse(websocket: WebSocket, fault: ClientFault) -> None:
    if websocket.client_state == WebSocketState.CONNECTED:
        try:
            await websocket.send_text(json.dumps({"type": "error", "message": str(fault)}))
            await websocket.close(fault.code)
        except (RuntimeError, WebSocketDisconnect):
            pass


async def serve_websocket(websocket: WebSocket) -> None:
    """One connection: receive audio and control messages, send the decoder's results."""
    decoder: LiveDecoder = websocket.app.state.decoder
    config = decoder.config
    await websocket.accept()
    try:
        connection = decoder.open()
    except ClientFault as fault:
        await _refuse(websocket, fault)
        return
    peer = f"{websocket.client.host}:{websocket.client.port}" if websocket.client else "?"
    log.info("stream opened from %s (%d live)", peer, len(decoder.connections))
    recognizer = decoder.recognizer
    await websocket.send_text(
        json.dumps(
            {
                "type": "ready",
                "sample_rate": SAMPLE_RATE,
                "format": connection.format,
                "chunk_ms": round(recognizer.chunk_seconds * 1000, 3),
                "left_context_ms": round(
                    recognizer.chunking.left * recognizer.model.frame_seconds * 1000, 3
                ),
                "max_frame_bytes": config.max_frame_bytes,
            }
        )
    )
    sender = asyncio.create_task(_send_outbox(websocket, connection))
    try:
        while not connection.ending:
            receive = asyncio.ensure_future(websocket.receive())
            done, _ = await asyncio.wait(
                {receive, sender}, timeout=config.idle_timeout_s, return_when="FIRST_COMPLETED"
            )
            if sender in done:  # the decoder ended this stream (an internal error)
                receive.cancel()
                return
            if not done:
                receive.cancel()
                raise ClientFault(f"no data for {config.idle_timeout_s:g} s: closing")
            message = receive.result()
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", 1000))
            if (data := message.get("bytes")) is not None:
                if len(data) > config.max_frame_bytes:
                    raise ClientFault(
                        f"a frame of {len(data)} bytes is over the limit of "
                        f"{config.max_frame_bytes} (--max-frame-bytes)",
                        CLOSE_TOO_BIG,
                    )
                connection.audio(data)
            elif (text := message.get("text")) is not None:
                request = connection.control(text)
                if request is not None:
                    biasing = None
                    if request.phrases is not None:
                        biasing = await decoder.biasing_graph(request.phrases, request.score)
                    connection.open_stream(biasing)
            decoder.wake()
        await sender  # the last final, then the end
    except ClientFault as fault:
        log.info("stream from %s refused: %s", peer, fault)
        decoder.close(connection)
        sender.cancel()
        await _refuse(websocket, fault)
    except WebSocketDisconnect:
        log.info("stream from %s left", peer)
        sender.cancel()
    finally:
        decoder.close(connection)
        log.info("stream closed from %s (%d live)", peer, len(decoder.connections))


async def _status(request) -> JSONResponse:
    decoder: LiveDecoder = request.app.state.decoder
    recognizer = decoder.recognizer
    example: Path | None = request.app.state.example
    return JSONResponse(
        {
            "example": None if example is None else example.name,
            "streams": len(decoder.connections),
            "max_streams": decoder.config.max_streams,
            "chunk_ms": round(recognizer.chunk_seconds * 1000, 3),
            "batches": decoder.batches,
            "compute_s": round(decoder.compute_s, 3),
        }
    )


async def _index(request) -> FileResponse:
    return FileResponse(WEB_DIR / "index.html")


async def _example(request) -> Response:
    example: Path | None = request.app.state.example
    if example is None:
        return Response("this server has no example (asr-serve --example AUDIO)", 404)
    return FileResponse(example)


def create_app(
    recognizer: StreamingRecognizer,
    config: ServeConfig | None = None,
    example: Path | None = None,
    lm: LmFusion | None = None,
) -> Starlette:
    """The server's ASGI application: the page at /, its files under /static, the
    websocket at /ws, a JSON status at /status and, with `example` (an audio file the
    model transcribes well, such as a demo test utterance), that file at /example, which
    the page's "Play the example" button streams at real time. `lm`: a language model
    (`recognizer.language_model(path, weight, ...)`) that every connection's search fuses,
    the same object for all, so that their streams share search steps."""
    if example is not None and not Path(example).is_file():
        raise FileNotFoundError(f"--example {example}: no such file")
    decoder = LiveDecoder(recognizer, config or ServeConfig(), lm)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        decoder.start()
        yield
        await decoder.stop()

    app = Starlette(
        routes=[
            Route("/", _index),
            Route("/status", _status),
            Route("/example", _example),
            Route("/favicon.ico", lambda request: Response(status_code=204)),  # none: no 404
            WebSocketRoute("/ws", serve_websocket),
            Mount("/static", StaticFiles(directory=WEB_DIR), name="static"),
        ],
        lifespan=lifespan,
    )
    app.state.decoder = decoder
    app.state.example = None if example is None else Path(example)
    return app
