// asr-serve's page: streams the microphone, or a file or the server's example at real time, to the server's
// websocket (/ws) as 16 kHz mono float32 pieces of 100 ms, and shows the partial text as
// it grows, each final segment with its times and its words' confidences (the doubtful
// ones underlined), and the latency of the last partial (from sending the piece that
// completed the decoded audio to receiving the result). Phrases typed in the box are sent
// in the start message, for this recording's search to boost. The protocol is in
// docs/serving.md.

const RATE = 16000;
// The samples a chunk's last feature frame needs beyond its audio_s: the 25 ms window is
// centred on the frame's 10 ms (Kaldi's frames without snip_edges), 200 - 80 = 120 samples.
const FRAME_LOOKAHEAD = 120;
const PIECE = 1600; // 100 ms
const DOUBTFUL = 0.8; // a word under this confidence is underlined
const $ = (id) => document.getElementById(id);

const page = {
  // read by the browser test (tests/inference/test_serve_page.py) as a person reads the page
  finals: [],
  partial: "",
  latencyMs: null,
  sentSamples: 0, // of the current recording
  biasing: [], // the phrases sent with the current recording (the start message's "context")
  state: "idle", // idle | live | ending | done | error
};
window.asrPage = page;

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

function seconds(value) {
  return value.toFixed(2);
}

class Session {
  // One recording: a websocket of its own, the pieces sent and when.
  constructor(label, onEnd) {
    this.label = label;
    this.onEnd = onEnd;
    this.sentSamples = 0;
    this.sent = []; // [samples sent so far, time] per piece
    this.ended = false;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    this.ws = new WebSocket(`${scheme}://${location.host}/ws`);
    this.ws.binaryType = "arraybuffer";
    this.ready = new Promise((resolve, reject) => {
      this.ws.onmessage = (event) => this.receive(JSON.parse(event.data), resolve);
      this.ws.onerror = () => reject(new Error("the connection failed"));
    });
    this.ws.onclose = (event) => {
      if (!this.ended) this.finish(event.code === 1000 ? "" : `connection closed (${event.code})`);
    };
  }

  receive(message, resolve) {
    if (message.type === "ready") {
      page.biasing = phrases();
      if (page.biasing.length) {
        this.ws.send(JSON.stringify({ type: "start", format: "f32le", context: page.biasing }));
      }
      const boosted = page.biasing.length ? `, ${page.biasing.length} phrase(s) boosted` : "";
      setStatus(`${this.label}: live, ${message.chunk_ms} ms chunks${boosted}`);
      resolve(message);
    } else if (message.type === "partial") {
      page.partial = message.text;
      $("partial").textContent = message.text;
      $("decoded").textContent = seconds(message.audio_s);
      this.latency(message.audio_s);
    } else if (message.type === "final") {
      this.addFinal(message);
    } else if (message.type === "end") {
      this.finish("");
    } else if (message.type === "error") {
      this.finish(message.message);
    }
  }

  latency(audioSeconds) {
    const needed = Math.round(audioSeconds * RATE) + FRAME_LOOKAHEAD; // the chunk's last sample
    const now = performance.now();
    while (this.sent.length && this.sent[0][0] < needed) this.sent.shift();
    if (this.sent.length) {
      page.latencyMs = Math.round(now - this.sent[0][1]);
      $("latency").textContent = `${page.latencyMs} ms`;
    }
  }

  addFinal(message) {
    page.finals.push({ segment: message.segment, text: message.text, start: message.start, end: message.end, words: message.words });
    page.partial = "";
    $("partial").textContent = "";
    if (!message.text.trim()) return;
    const item = document.createElement("li");
    const time = document.createElement("span");
    time.className = "time";
    time.textContent = `${seconds(message.start)}–${seconds(message.end)} s`;
    const text = document.createElement("span");
    text.className = "text";
    message.words.forEach((w, i) => {
      const word = document.createElement("span");
      word.className = w.confidence < DOUBTFUL ? "word doubtful" : "word";
      word.dataset.confidence = w.confidence;
      word.textContent = w.word;
      if (i) text.append(" ");
      text.append(word);
    });
    item.append(time, text);
    item.title = message.words
      .map((w) => `${w.word} ${seconds(w.start)}–${seconds(w.end)} s, confidence ${w.confidence.toFixed(2)}`)
      .join("\n");
    $("finals").append(item);
  }

  send(samples) {
    if (this.ws.readyState !== WebSocket.OPEN || this.ended) return;
    this.ws.send(samples.buffer.slice(samples.byteOffset, samples.byteOffset + samples.byteLength));
    this.sentSamples += samples.length;
    page.sentSamples = this.sentSamples;
    this.sent.push([this.sentSamples, performance.now()]);
  }

  end() {
    if (this.ended) return; // an error ended it already: its state stays
    if (this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify({ type: "end" }));
    page.state = "ending";
  }

  finish(error) {
    if (this.ended) return;
    this.ended = true;
    page.state = error ? "error" : "done";
    setStatus(error ? `${this.label}: ${error}` : `${this.label}: done`, Boolean(error));
    this.onEnd();
  }
}

// -- the microphone ------------------------------------------------------------------------
let mic = null; // {session, context, stream}

async function startMic() {
  const stream = await navigator.mediaDevices.getUserMedia({
    audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
  });
  const context = new AudioContext();
  await context.audioWorklet.addModule("/static/pcm-worklet.js");
  const session = new Session("microphone", stopMicDevices);
  await session.ready;
  const source = context.createMediaStreamSource(stream);
  const node = new AudioWorkletNode(context, "pcm-resampler");
  const mute = context.createGain();
  mute.gain.value = 0; // the graph pulls the worklet through the destination; nothing is heard
  node.port.onmessage = (event) => session.send(event.data);
  source.connect(node).connect(mute).connect(context.destination);
  mic = { session, context, stream };
  page.state = "live";
  $("mic").textContent = "Stop";
  $("mic").classList.add("live");
}

function stopMicDevices() {
  if (!mic) return;
  mic.stream.getTracks().forEach((track) => track.stop());
  mic.context.close();
  mic = null;
  $("mic").textContent = "Start the microphone";
  $("mic").classList.remove("live");
  setControls(true);
}

$("mic").addEventListener("click", async () => {
  if (mic) {
    mic.session.end(); // the server's last final and end close the session
    return;
  }
  setControls(false);
  $("mic").disabled = false;
  try {
    await startMic();
  } catch (error) {
    setStatus(`microphone: ${error.message}`, true);
    stopMicDevices();
  }
});

// -- a file, at real time ------------------------------------------------------------------
async function samplesOf(file) {
  // decoded straight at 16 kHz (a 16 kHz file's samples are sent as they are), then mixed
  // down to one channel
  const decoded = await new OfflineAudioContext(1, 1, RATE).decodeAudioData(await file.arrayBuffer());
  const mono = new Float32Array(decoded.length);
  for (let c = 0; c < decoded.numberOfChannels; c++) {
    const channel = decoded.getChannelData(c);
    for (let i = 0; i < mono.length; i++) mono[i] += channel[i] / decoded.numberOfChannels;
  }
  return mono;
}

async function streamFile(file, label = file.name) {
  setControls(false);
  let samples;
  try {
    samples = await samplesOf(file);
  } catch (error) {
    setStatus(`${label}: not audio the browser can decode (${error.message})`, true);
    setControls(true);
    return;
  }
  const session = new Session(label, () => setControls(true));
  await session.ready;
  page.state = "live";
  const began = performance.now();
  for (let at = 0; at < samples.length && !session.ended; at += PIECE) {
    const due = began + (at / RATE) * 1000;
    const wait = due - performance.now();
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
    session.send(samples.subarray(at, Math.min(at + PIECE, samples.length)));
  }
  session.end();
}

$("file").addEventListener("change", (event) => {
  if (event.target.files.length) streamFile(event.target.files[0]);
  event.target.value = "";
});
const drop = $("drop");
drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (event) => {
  event.preventDefault();
  drop.classList.remove("over");
  if (event.dataTransfer.files.length && !$("file").disabled) streamFile(event.dataTransfer.files[0]);
});

// -- the server's example (asr-serve --example), at real time --------------------------------
let example = null; // its file name, when the server has one

$("example").addEventListener("click", async () => {
  setControls(false);
  try {
    const response = await fetch("/example");
    if (!response.ok) throw new Error(`${response.status}`);
    await streamFile(await response.blob(), `example ${example}`);
  } catch (error) {
    setStatus(`the example could not be fetched (${error.message})`, true);
    setControls(true);
  }
});

function setControls(enabled) {
  $("example").disabled = !enabled;
  $("mic").disabled = !enabled;
  $("file").disabled = !enabled;
  $("phrases").disabled = !enabled;
}

function phrases() {
  // the box's lines, blank ones left out (the server checks each and names a bad one)
  return $("phrases").value.split("\n").map((line) => line.trim()).filter((line) => line);
}

// -- start -----------------------------------------------------------------------------------
fetch("/status")
  .then((response) => response.json())
  .then((status) => {
    example = status.example;
    $("example").hidden = $("hears").hidden = !example;
    setStatus(`ready: ${status.chunk_ms} ms chunks, ${status.streams} of ${status.max_streams} streams live`);
    setControls(true);
  })
  .catch(() => setStatus("the server does not answer", true));
