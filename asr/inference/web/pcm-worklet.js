// asr-serve's page: an AudioWorklet that turns the microphone into 16 kHz mono float32
// pieces of 100 ms. The AudioContext runs at the device's rate (44.1 or 48 kHz); the
// samples are low-passed below 8 kHz (two biquad sections) and resampled by linear
// interpolation, then posted to the page, which sends them to the server.

const TARGET_RATE = 16000;
const PIECE = 1600; // samples at 16 kHz: 100 ms

class Biquad {
  // RBJ cookbook low-pass.
  constructor(rate, cutoff, q) {
    const w = (2 * Math.PI * cutoff) / rate;
    const alpha = Math.sin(w) / (2 * q);
    const cos = Math.cos(w);
    const a0 = 1 + alpha;
    this.b0 = (1 - cos) / 2 / a0;
    this.b1 = (1 - cos) / a0;
    this.b2 = (1 - cos) / 2 / a0;
    this.a1 = (-2 * cos) / a0;
    this.a2 = (1 - alpha) / a0;
    this.x1 = this.x2 = this.y1 = this.y2 = 0;
  }
  run(x) {
    const y = this.b0 * x + this.b1 * this.x1 + this.b2 * this.x2 - this.a1 * this.y1 - this.a2 * this.y2;
    this.x2 = this.x1; this.x1 = x; this.y2 = this.y1; this.y1 = y;
    return y;
  }
}

class PcmResampler extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / TARGET_RATE; // input samples per output sample
    this.filters = sampleRate > TARGET_RATE
      ? [new Biquad(sampleRate, 7200, 0.541), new Biquad(sampleRate, 7200, 1.307)]
      : [];
    this.position = 0; // of the next output sample, in input samples after `previous`
    this.previous = 0;
    this.out = new Float32Array(PIECE);
    this.filled = 0;
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || channels.length === 0) return true;
    const input = channels[0];
    for (let i = 0; i < input.length; i++) {
      let x = 0;
      for (const channel of channels) x += channel[i];
      x /= channels.length;
      for (const f of this.filters) x = f.run(x);
      // output samples that fall between previous (at -1) and x (at 0)
      while (this.position <= 0) {
        const t = this.position + 1; // 0..1 from previous to x
        this.out[this.filled++] = this.previous + t * (x - this.previous);
        this.position += this.step;
        if (this.filled === PIECE) {
          this.port.postMessage(this.out.slice(0));
          this.filled = 0;
        }
      }
      this.position -= 1;
      this.previous = x;
    }
    return true;
  }
}

registerProcessor("pcm-resampler", PcmResampler);
