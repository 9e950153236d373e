#!/usr/bin/env bash
# Demo recipe: a synthetic LibriSpeech-layout corpus -> Conformer-Transducer -> WER.
#
#   recipes/demo/run.sh                       # every stage
#   recipes/demo/run.sh --stage train         # from a stage on (name or number)
#   recipes/demo/run.sh --stage 4 --stop-stage 4
#   recipes/demo/run.sh --dry-run --stage train -- trainer.max_epochs=4
#   recipes/demo/run.sh --shar --stage features --stop-stage features   # Shar shards too
#
# --dry-run lists the stages it would run and the overrides after "--", checked by resolving
# the experiment's config (read-only), then exits: nothing is run or written. The project's
# .venv (make install) is used when asr-train is not on PATH (recipes/stages.sh).
#
# Stages: 0 corpus, 1 manifests, 2 tokenizer, 3 features, 4 bins, 5 batch-sizes, 6 train,
# 7 decode, 8 lm, 9 export, 10 transcribe, 11 plots. Each stage skips work already done, so
# re-running is cheap; extra arguments after "--" go to asr-train (Hydra overrides), e.g.
# -- trainer.max_epochs=2.
#
# Device: DEVICE=auto (the default) trains and decodes on the GPU where torch sees one, else
# on the CPU; cpu or cuda to choose. Either way the preset's batches and schedule, so a GPU
# takes the same steps as a CPU, each much faster: fp32 on every CPU (every CPU gives the
# same result), bf16 on a GPU (trainer.precision=auto).
#
# Batches: each demo preset ships its buckets and batch sizes (asr/configs/batches/, picked by
# the preset), and training uses them, so that the demo takes the same steps, and gives the
# same WER, on every machine; stages 4-5 then only say so. BATCH_SEARCH=1 estimates the
# buckets from this corpus (stage 4, data/demo/bins.yaml) and searches the batch sizes on the
# training device in the training's precision (stage 5, exp/<experiment>/batch_sizes.yaml;
# remove it to search again), prints where they differ from the shipped ones, and trains with
# them. BATCH_MEMORY is the memory one training step may use (setting it implies
# BATCH_SEARCH=1; default 170MiB, the shipped sets' budget). The presets' learning-rate
# schedules and epochs are tuned for their shipped batches: larger ones (a GPU holds
# hundreds of these utterances) give fewer updates per epoch and a worse model in the same
# epochs.
#
# Decoding (stage 7): greedy search, and beam search of BEAM hypotheses (default 4; 1 skips
# it), both printed at the end.
#
# Language models (stage 8, docs/recipes.md): LM_SENTENCES (default 200,000) sentences of
# the demo's grammar that no dev or test utterance holds (asr-make-lm-text, $DATA/lm/
# lm_text.txt.gz), an LM_ORDER-gram (default 6) over the tokenizer's pieces trained on them
# ($DATA/lm/bpe128_6gram.arpa.gz) and the LODR bigram of the training transcripts
# (train-clean-100's supervisions, $DATA/lm/bpe128_lodr_2gram.arpa.gz), both with
# asr-train-lm and kept in $DATA/lm beside the tokenizer they are over (a file there, the
# text or an ARPA file, is not made again: remove it to remake it); then beam search of
# LM_BEAM hypotheses (default 8) on test-clean without and with the LM and LODR, at
# asr-decode's default weights (LM_WEIGHT, LODR_WEIGHT to choose: asr-sweep chooses them on
# a dev set), both WERs printed at the end (exp/<experiment>/decode-test-clean-beam8{,-lm}).
# On make demo's model: 7.25 % without, 2.07 % with (docs/recipes.md: times).
#
# Shar shards (--shar, or SHAR=1): stage 3 also writes the training part as lhotse Shar shards
# (asr-export-shar: its audio as FLAC and its stored features, docs/data.md) into
# data/demo/shar/train-clean-100-<features>/, named as the features manifest they come from.
#
# EXPERIMENT picks the Hydra preset (default demo; demo_tdt, demo_stateless, demo_streaming,
# demo_aed_deep, demo_aed_flash), EXP its directory (exp/<experiment>).
set -euo pipefail

stage=0
stop_stage=11
data=${DATA:-data/demo}
device=${DEVICE:-auto}
train_hours=${TRAIN_HOURS:-2}
batch_memory=${BATCH_MEMORY:-}
batch_search=${BATCH_SEARCH:-}
shar=${SHAR:-0}
beam=${BEAM:-4}
[[ $beam =~ ^[1-9][0-9]*$ ]] || { echo "BEAM must be a beam size (1: greedy search only), not '$beam'" >&2; exit 2; }
lm_beam=${LM_BEAM:-8}
[[ $lm_beam =~ ^[1-9][0-9]*$ ]] || { echo "LM_BEAM must be a beam size, not '$lm_beam'" >&2; exit 2; }
lm_order=${LM_ORDER:-6}
lm_sentences=${LM_SENTENCES:-200000}
lm_weight=${LM_WEIGHT:-}  # empty: asr-decode's defaults
lodr_weight=${LODR_WEIGHT:-}
[[ -n $batch_memory ]] && batch_search=1
[[ $batch_search == 0 ]] && batch_search=

names=(corpus manifests tokenizer features bins batch-sizes train decode lm export transcribe
  plots)
source "$(dirname "$0")/../stages.sh"
parse_stages "$@"
[[ $shar == 0 || $shar == 1 ]] || { echo "SHAR must be 0 or 1, not '$shar'" >&2; exit 2; }
if [[ $device == auto ]]; then  # torch (seconds to import) is asked only beside an NVIDIA driver
  device=cpu
  if [[ -e /proc/driver/nvidia/version ]]; then
    device=$(python -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')
  fi
fi
case $device in
  cpu) accelerator=cpu ;;
  cuda) accelerator=gpu ;;
  *) echo "DEVICE must be auto, cpu or cuda, not '$device'" >&2; exit 2 ;;
esac
# CPU kernels: CPU_ISA=avx2 (the default) runs torch's, oneDNN's and MKL's AVX2 kernels on
# every x86 CPU that has AVX2, AVX-512 ones included, so that CPUs compute the same numbers
# and train the same model (with the same number of threads: 2 on a 2-core CPU); on the demo
# they are as fast as the AVX-512 ones (recipes/demo/RESULTS.md). CPU_ISA=native lets each
# library pick the CPU's best: the rounding, and with it the model and its test WER, then
# moves with the CPU (measured in recipes/demo/RESULTS.md). ATEN_CPU_CAPABILITY,
# ONEDNN_MAX_CPU_ISA and MKL_CBWR set by you are kept.
cpu_isa=${CPU_ISA:-avx2}
case $cpu_isa in
  avx2 | native) ;;
  *) echo "CPU_ISA must be avx2 or native, not '$cpu_isa'" >&2; exit 2 ;;
esac
kernels=native
if [[ $device == cpu && $cpu_isa == avx2 ]] && grep -qw avx2 /proc/cpuinfo 2>/dev/null \
  && grep -qw fma /proc/cpuinfo; then
  export ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-avx2} ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-AVX2}
  export MKL_CBWR=${MKL_CBWR:-AVX2}
  kernels="ATEN_CPU_CAPABILITY=$ATEN_CPU_CAPABILITY ONEDNN_MAX_CPU_ISA=$ONEDNN_MAX_CPU_ISA"
  kernels+=" MKL_CBWR=$MKL_CBWR"
fi
experiment=${EXPERIMENT:-demo}
exp=${EXP:-exp/$experiment}
device_args=(trainer.accelerator="$accelerator" trainer.devices=1)  # before the user's overrides
manifests=$data/manifests
cuts() { echo "$manifests/librispeech_cuts_$1.jsonl.gz"; }
# The experiment's config, resolved with the overrides before any stage runs (a real run and
# a dry run alike), so that a mistyped key fails at once; `setting KEY` reads a key of it.
config=$(resolved_config experiment="$experiment" data_dir="$data" "${device_args[@]}" "${train_args[@]}")
# The tokenizer is data.tokenizer (asr/configs/data/demo.yaml), whose name bpe<N>.model gives
# the vocabulary size: the config is the one place for both.
tokenizer=$(setting data.tokenizer)
vocab_size=$(basename "$tokenizer" .model)
vocab_size=${vocab_size#bpe}
[[ $vocab_size =~ ^[0-9]+$ ]] || {
  echo "data.tokenizer=$tokenizer: expected a name bpe<vocabulary size>.model" >&2; exit 2; }
# A preset that keeps an EMA of the weights (ema=scaled, as the demo's) is decoded and exported
# with it: the EMA chose best.ckpt and is the better model of a short run.
weights=(); [[ -n $(setting ema) ]] && weights=(--ema)
# A streaming preset's trained chunks in milliseconds (encoder frames of 10 ms x subsampling).
chunk_ms=()
frame_ms=$(( 10 * $(setting model.encoder.subsampling_factor | sed -n 1p) ))
for c in $(setting model.encoder.streaming.chunk_sizes | tr -d '[],'); do
  if (( c > 0 )); then chunk_ms+=($(( c * frame_ms ))); fi
done
shar_note=; [[ $shar == 1 ]] && shar_note=", Shar shards: $data/shar"
end_dry_run "experiment: $experiment, device: $device (kernels: $kernels), data: $data, exp: $exp, tokenizer: $tokenizer$shar_note"

if run 0; then say 0
  asr-make-demo-corpus "$data" --train-hours "$train_hours"
fi
if run 1; then say 1
  asr-prepare-manifests --corpus-dir "$data/LibriSpeech" --output-dir "$manifests"
fi
if run 2; then say 2
  if [[ -f $tokenizer ]]; then echo "$tokenizer exists"; else
    asr-train-tokenizer --cuts "$(cuts train-clean-100)" --vocab-size "$vocab_size" \
      --output "$tokenizer"
  fi
fi
if run 3; then say 3
  # Features of the preset's front end (kaldi: *-feats, librosa: *-librosa-feats manifests),
  # and the global statistics a streaming preset normalizes with (model.encoder.feature_stats).
  frontend=$(setting data.features.frontend)
  feats=feats; [[ $frontend == kaldi ]] || feats=$frontend-feats
  for part in train-clean-100 dev-clean; do
    asr-compute-features --cuts "$(cuts $part)" --frontend "$frontend" --output "$(cuts $part-$feats)"
  done
  stats=$(setting model.encoder.feature_stats)
  if [[ -n $stats && ! -f $stats ]]; then
    asr-feature-stats --cuts "$(cuts train-clean-100-$feats)" --frontend "$frontend" --output "$stats"
  elif [[ -n $stats ]]; then echo "$stats exists"; fi
  shards=$data/shar/train-clean-100-$feats  # --shar: the training part as Shar shards
  if [[ $shar == 1 && -f $shards/shar_index.json ]]; then echo "$shards exists"
  elif [[ $shar == 1 ]]; then
    asr-export-shar "$(cuts train-clean-100-$feats)" --fields recording features -o "$shards"
  fi
fi
bins=$data/bins.yaml
batch_sizes=$exp/batch_sizes.yaml
batches_args=()  # the preset's shipped batches, unless searched
[[ -n $batch_search ]] && batches_args=(data.sampler.bins_file="$batch_sizes")
shipped="the buckets and batch sizes that experiment=$experiment ships (asr/configs/batches/)"
if run 4; then say 4
  if [[ -z $batch_search ]]; then echo "training uses $shipped; BATCH_SEARCH=1 estimates them"
  elif [[ -f $bins ]]; then echo "$bins exists"; else
    # 6 duration bins x 2 token bins of equal totals, per-bucket tokens-per-second limits
    asr-estimate-bins "$(cuts train-clean-100)" --tokenizer "$tokenizer" \
      --num-buckets 6 --num-token-buckets 2 -o "$bins"
  fi
fi
if run 5; then say 5
  if [[ -z $batch_search ]]; then echo "training uses $shipped; BATCH_SEARCH=1 searches them"
  elif [[ -f $batch_sizes ]]; then echo "$batch_sizes exists"; else
    # it prints where its batch sizes differ from the shipped ones
    asr-oomptimizer experiment="$experiment" data_dir="$data" "${device_args[@]}" "${train_args[@]}" \
      --bins-file "$bins" --memory-budget "${batch_memory:-170MiB}" \
      --device "$device" -o "$batch_sizes"
  fi
fi
if run 6; then say 6
  # demo_streaming starts from make demo's model (init_from): trained first if missing
  [[ -z $(setting init_from) ]] || train_missing_init demo features export
  # run_test=false: stage 7 decodes the test set
  asr-train experiment="$experiment" data_dir="$data" exp_dir="$exp" run_test=false \
    "${device_args[@]}" "${batches_args[@]}" "${train_args[@]}"
fi
if run 7; then say 7  # greedy search, then beam search (BEAM=1 skips it)
  asr-decode "$exp/checkpoints/last.ckpt" "$(cuts test-clean)" "${weights[@]}" \
    --device "$device" -o "$exp/decode-test-clean"
  for ms in "${chunk_ms[@]}"; do  # a streaming model: greedy at each trained chunk too
    asr-decode "$exp/checkpoints/last.ckpt" "$(cuts test-clean)" "${weights[@]}" \
      --chunk-ms "$ms" --device "$device" -o "$exp/decode-test-clean-chunk${ms}ms"
  done
  if (( beam > 1 )); then
    asr-decode "$exp/checkpoints/last.ckpt" "$(cuts test-clean)" "${weights[@]}" \
      --beam-size "$beam" --device "$device" -o "$exp/decode-test-clean-beam$beam"
  fi
fi
# A token-and-duration transducer is compared with make demo's model (same data, same budget):
# that one is trained and decoded first when exp/demo has no decode of it.
if run 7 && [[ -n $(setting model.joiner.durations) && ! -f exp/demo/decode-test-clean/wer.json ]]
then
  echo "make demo's transducer (exp/demo), which the TDT is compared with: trained and decoded first"
  EXPERIMENT=demo EXP=exp/demo bash "$0" --stage 6 --stop-stage 7
  printf '\n=== back to experiment=%s (%d s elapsed) ===\n' "$experiment" "$SECONDS"
fi
# The language models of stage 8 (over the tokenizer's pieces: named by it, kept in $DATA/lm)
lm_dir=$data/lm
lm_text=$lm_dir/lm_text.txt.gz
pieces=$(basename "$tokenizer" .model)
lm=$lm_dir/${pieces}_${lm_order}gram.arpa.gz
lodr=$lm_dir/${pieces}_lodr_2gram.arpa.gz
lm_args=(--lm "$lm" --lodr "$lodr")
[[ -n $lm_weight ]] && lm_args+=(--lm-weight "$lm_weight")
[[ -n $lodr_weight ]] && lm_args+=(--lodr-weight "$lodr_weight")
lm_decode=$exp/decode-test-clean-beam$lm_beam  # without the LM; with it: $lm_decode-lm
if run 8; then say 8
  [[ -f $tokenizer ]] || { echo "no tokenizer $tokenizer: run the tokenizer stage first" >&2; exit 1; }
  [[ -f $exp/checkpoints/last.ckpt ]] || {
    echo "no model $exp/checkpoints/last.ckpt: run the train stage first (or set EXP)" >&2; exit 1; }
  if [[ -f $lm ]]; then echo "$lm exists"; else
    if [[ -f $lm_text ]]; then echo "$lm_text exists"; else
      asr-make-lm-text "$lm_text" --corpus "$data" --sentences "$lm_sentences"
    fi
    asr-train-lm "$lm_text" --tokenizer "$tokenizer" --order "$lm_order" -o "$lm"
  fi
  if [[ -f $lodr ]]; then echo "$lodr exists"; else  # the supervisions' text
    asr-train-lm "$manifests/librispeech_supervisions_train-clean-100.jsonl.gz" \
      --tokenizer "$tokenizer" --order 2 -o "$lodr"
  fi
  if run 7 && (( lm_beam == beam )); then echo "$lm_decode: decoded by stage 7"; else
    asr-decode "$exp/checkpoints/last.ckpt" "$(cuts test-clean)" "${weights[@]}" \
      --beam-size "$lm_beam" --device "$device" -o "$lm_decode"
  fi
  asr-decode "$exp/checkpoints/last.ckpt" "$(cuts test-clean)" "${weights[@]}" \
    --beam-size "$lm_beam" "${lm_args[@]}" --device "$device" -o "$lm_decode-lm"
fi
if run 9; then say 9
  asr-export "$exp/checkpoints/last.ckpt" "${weights[@]}" -o "$exp/model.bundle.pt"
  # A transducer's ONNX graphs too, which sherpa-onnx decodes (about 30 s more; docs/export.md):
  # the stateless predictor's in icefall's contract, the LSTM one's in NeMo's, a streaming
  # model's in NeMo's online contract (docs/streaming.md).
  if [[ $(setting model.kind) == transducer ]]; then
    asr-export "$exp/checkpoints/last.ckpt" "${weights[@]}" --format onnx -o "$exp/onnx"
  fi
fi
if run 10; then say 10
  # sed reads the whole list: `head` would close the pipe early, and under pipefail sort's
  # SIGPIPE (exit 141) stopped a fresh clone's run here
  wav=$(find "$data/LibriSpeech/test-clean" -name '*.flac' | sort | sed -n 1p)
  echo "reference: $(grep "$(basename "$wav" .flac)" "$(dirname "$wav")"/*.trans.txt | cut -d' ' -f2-)"
  asr-transcribe "$exp/model.bundle.pt" "$wav"
fi
if run 11; then say 11
  asr-plot training "$exp" -o "$exp/training.png"
  plan=$batch_sizes
  if [[ -z $batch_search ]]; then  # the shipped buckets, as the training's config holds them
    plan=$exp/batches.yaml
    setting data.sampler > "$plan"
  fi
  asr-plot bins "$plan" --cuts "$(cuts train-clean-100)" -o "$exp/bins.png"
fi
wer() { python -c "import json,sys;print(json.load(open(sys.argv[1]))['wer'])" "$1/wer.json"; }
if [[ -f $exp/decode-test-clean/wer.json ]]; then
  printf '\nTest WER (test-clean of the demo corpus): %s%% (greedy search)' "$(wer "$exp/decode-test-clean")"
  if (( beam > 1 )) && [[ -f $exp/decode-test-clean-beam$beam/wer.json ]]; then
    printf ', %s%% (beam search, %s)' "$(wer "$exp/decode-test-clean-beam$beam")" "$beam"
  fi
  echo
  # A token-and-duration transducer: beside make demo's plain transducer (same data, budget).
  if [[ -n $(setting model.joiner.durations) ]]; then
    plain=exp/demo/decode-test-clean
    if [[ -f $plain/wer.json ]]; then
      printf "  make demo's transducer: %s%% (greedy)" "$(wer "$plain")"
      if [[ -f $plain-beam$beam/wer.json ]]; then
        printf ', %s%% (beam search, %s)' "$(wer "$plain-beam$beam")" "$beam"
      fi
      echo
    fi
  fi
  # A streaming model: greedy WER per chunk, beside the full-context model it started from.
  base=exp/demo; init=$(setting init_from); [[ -n $init ]] && base=$(dirname "$init")
  base=$base/decode-test-clean
  for ms in "${chunk_ms[@]}"; do
    [[ -f $exp/decode-test-clean-chunk${ms}ms/wer.json ]] || continue
    printf '  streaming, %s ms chunks: %s%% (greedy)' "$ms" "$(wer "$exp/decode-test-clean-chunk${ms}ms")"
    if [[ -n $base && -f $base/wer.json ]]; then
      python -c "import sys; print(f', {float(sys.argv[1]) / float(sys.argv[2]):.2f}x the full-context model\'s {float(sys.argv[2]):.2f}%')" \
        "$(wer "$exp/decode-test-clean-chunk${ms}ms")" "$(wer "$base")"
    else echo; fi
  done
fi
# Stage 8's decodes: beam search without and with the LM and LODR, one line each.
if [[ -f $lm_decode/wer.json && -f $lm_decode-lm/wer.json ]]; then
  printf '\nTest WER with language models (test-clean, beam search, %s):\n' "$lm_beam"
  printf '  without LM: %s%%\n' "$(wer "$lm_decode")"
  python - "$lm_decode-lm/wer.json" <<'EOF'
import json
import sys
from pathlib import Path

result = json.loads(Path(sys.argv[1]).read_text())
lm = result["language_model"]  # what asr-decode fused, and the weights
fused = f"LM {Path(lm['lm']).name} x {lm['lm_weight']:g}"
if "lodr" in lm:
    fused += f", LODR {Path(lm['lodr']).name} x {lm['lodr_weight']:g}"
print(f"  with LM + LODR: {result['wer']}% ({fused})")
EOF
fi
