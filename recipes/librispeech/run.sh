#!/usr/bin/env bash
# LibriSpeech Conformer-Transducer (~100M parameters, experiment=librispeech_transducer) on GPUs.
#
#   recipes/librispeech/run.sh                           # every stage, 960 h
#   PARTS=mini recipes/librispeech/run.sh                # mini LibriSpeech (train-clean-5, dev-clean-2)
#   recipes/librispeech/run.sh --stage train -- trainer.devices=4
#   recipes/librispeech/run.sh --dry-run --stage train   # the stages it would run; runs nothing
#   SHAR=1 recipes/librispeech/run.sh --stage features --stop-stage features  # Shar shards
#   MUSAN=1 recipes/librispeech/run.sh --stage musan --stop-stage musan  # noise for data/augment
#
# --dry-run lists the stages it would run and the overrides after "--", then exits: nothing is
# run, downloaded or written. The project's .venv (make install) is used when asr-train is not
# on PATH (recipes/stages.sh).
#
# Stages: 0 download, 1 manifests, 2 musan (with MUSAN=1: MUSAN's noise manifest), 3 perturb,
# 4 tokenizer, 5 features (and, with SHAR=1, Shar shards of the training parts), 6 bins,
# 7 batch-sizes, 8 train, 9 decode, 10 lm (language models, and beam search with them),
# 11 export, 12 results (a table, training curves, buckets).
# Each stage skips work already done; arguments after "--" go to asr-train and
# asr-oomptimizer (Hydra overrides). Self-supervised pre-training,
# optional (docs/ssl.md; not run by default):
#   recipes/librispeech/run.sh --stage pretrain --stop-stage finetune
# 13 pretrain: experiment=librispeech_ssl_$SSL_OBJECTIVE on all the training audio
#   (transcripts unused): duration bins, its own batch-size search, training, and its
#   encoder exported (exp/librispeech_ssl_<objective>/encoder.pt); PRETRAIN_ARGS: Hydra
#   overrides of this stage alone (space-separated);
# 14 finetune: the transducer on train-clean-100 alone, its encoder from stage 13
#   (init_encoder_from), into EXP-ft-<objective>, then greedy decoding of the test sets.
# Stage 0 needs internet (about 60 GB from openslr.org; PARTS=mini: 0.4 GB), as do stage 2
# with MUSAN=1 (11 GB) and stage 10 (the LM text, 1.4 GB), and the whole recipe ~120 GB of
# disk (more with FEATURES=precomputed).
#
# Language models (stage 10, docs/decoding.md): the LibriSpeech LM text
# (openslr.org/11 librispeech-lm-norm.txt.gz: 40 M sentences, 800 M words of 14,500 books)
# downloaded like the corpus (asr-prepare-manifests --lm-text, lhotse's resumable download)
# to LM_TEXT unless a file is there; an LM_ORDER-gram over the BPE pieces of its first
# LM_MAX_LINES lines and the LODR bigram of the training transcripts (the training parts'
# supervisions), both with asr-train-lm into $DATA/lm (an ARPA file there is not trained
# again: remove it to retrain); then beam search of LM_BEAM hypotheses on the test sets
# with the LM and LODR (EXP/decode-<part>-beam<LM_BEAM>-lm), and without them where the decode
# stage has not decoded that beam, printed and in the results table.
#
# Environment (defaults in brackets):
#   DATA [data/librispeech], EXP [exp/librispeech_transducer]
#   PARTS [all]: all (960 h, dev and test clean/other) or mini (train-clean-5, dev-clean-2;
#     decoded on dev-clean-2: a quick check on real speech)
#   SPEED_PERTURB [1]: train on each part plus 0.9x and 1.1x speed copies (3x the audio)
#   FEATURES [on_the_fly]: fbank computed by the data loader workers (GPU machines have the
#     CPU to spare), or precomputed (stored once by stage 5, ~3x the disk with SPEED_PERTURB)
#   SHAR [0]: 1 (or --shar): stage 5 also writes each training part, as training reads it
#     (with its speed copies: 3x the audio), as lhotse Shar shards of 1000 cuts
#     (asr-export-shar: audio as FLAC, and the stored features with FEATURES=precomputed)
#     into $DATA/shar/<part>/, named as the manifest (e.g. train-clean-100-sp; docs/data.md)
#   MUSAN [0]: 1: stage 2 downloads MUSAN (11 GB from openslr.org, ~12 GB unpacked) into
#     $DATA/musan unless it is there, and writes $DATA/manifests/musan_cuts.jsonl.gz (its
#     music, speech and noise files of 5 s or more, asr-prepare-musan) for training with
#     noise: SPEED_PERTURB=0 recipes/librispeech/run.sh -- data/augment=librispeech (the
#     preset perturbs the speed itself, on the fly)
#   BATCH_MEMORY: the memory a training step may use for stage 7's batch-size search; default
#     85 % of the first GPU's memory (a safety margin: memory fragments over a long run, and
#     the search's worst case is not every batch's); DEVICE [cuda] where it searches
#   BATCH_TOLERANCE [0.05]: the search stops when the smallest batch known not to fit is
#     within this fraction of the largest that fits (larger: fewer probes, smaller batches)
#   EPOCH [the last], AVG [5]: the average of epochs EPOCH-AVG+1..EPOCH is decoded and exported
#   BEAM [4]: the beam of the decoding stage (greedy is always decoded too)
#   LM_TEXT [$DATA/lm/librispeech-lm-norm.txt.gz]: the LM text, downloaded to it unless it is
#     there (any text of one sentence a line, plain or gzipped: your own, or a stand-in)
#   LM_ORDER [6], LM_MAX_LINES [500000; all: every line]: the LM's order and the lines
#     of LM_TEXT it is trained on (the first ones). Why a bound: memory grows with the
#     distinct n-grams, about 1-2 per BPE token at order 6 (0.9 on asr/decoding/kneser_ney.py's
#     varied synthetic text). asr-train-lm holds 38 bytes a distinct n-gram (its
#     docstring), and the first decode with the ARPA file about 700 (it is read into
#     Python dictionaries, then cached beside it as tensors of about 25: measured on the
#     demo's 6-gram, 3.4 M n-grams). The whole text, 800 M words or about 1.2 G tokens,
#     would be a billion n-grams or more: 40 GB and up to train, hundreds of GB to load.
#     500,000 lines (20 words a line: 10 M words, about 15 M tokens, 15-30 M n-grams) take
#     0.6-1.2 GB to train and 10-21 GB to load once: a 32 GB machine. Raise it as memory
#     allows (the figures scale with it); the file is named by it, so another value
#     trains another LM.
#   LM_BEAM [8]: the beam of the lm stage; LM_WEIGHT, LODR_WEIGHT [asr-decode's defaults]:
#     the weights (asr-sweep chooses them on a dev set, docs/decoding.md)
#   VOCAB_SIZE [1024], NUM_BUCKETS [30], EXPERIMENT [librispeech_transducer;
#     librispeech_streaming: stage 5 also writes its feature statistics, stage 10 its
#     streaming ONNX export (docs/streaming.md)]
#   SSL_OBJECTIVE [best_rq]: best_rq or w2v_bert (stages 12-13), SSL_EXP
#     [exp/librispeech_ssl_<objective>]; FINETUNE_PARTS [train-clean-100]: the labelled parts
#     stage 13 trains on (stage 7's batch sizes); pre-training reads the training cuts the
#     transducer reads (with SPEED_PERTURB=1, the speed copies too)
set -euo pipefail

stage=0
stop_stage=12
data=${DATA:-data/librispeech}
experiment=${EXPERIMENT:-librispeech_transducer}
exp=${EXP:-exp/$experiment}
parts=${PARTS:-all}
speed_perturb=${SPEED_PERTURB:-1}
features=${FEATURES:-on_the_fly}
batch_memory=${BATCH_MEMORY:-}
device=${DEVICE:-cuda}
batch_tolerance=${BATCH_TOLERANCE:-0.05}
avg=${AVG:-5}
beam=${BEAM:-4}
lm_text=${LM_TEXT:-}  # set below: $data/lm/...
lm_order=${LM_ORDER:-6}
lm_max_lines=${LM_MAX_LINES:-500000}
lm_beam=${LM_BEAM:-8}
lm_weight=${LM_WEIGHT:-}  # empty: asr-decode's defaults
lodr_weight=${LODR_WEIGHT:-}
vocab_size=${VOCAB_SIZE:-1024}
num_buckets=${NUM_BUCKETS:-30}
ssl_objective=${SSL_OBJECTIVE:-best_rq}
read -ra pretrain_args <<< "${PRETRAIN_ARGS:-}"
read -ra finetune_parts <<< "${FINETUNE_PARTS:-train-clean-100}"
shar=${SHAR:-0}
musan=${MUSAN:-0}

names=(download manifests musan perturb tokenizer features bins batch-sizes train decode lm export
  results pretrain finetune)
source "$(dirname "$0")/../stages.sh"
parse_stages "$@"
[[ $shar == 0 || $shar == 1 ]] || { echo "SHAR must be 0 or 1, not '$shar'" >&2; exit 2; }
[[ $musan == 0 || $musan == 1 ]] || { echo "MUSAN must be 0 or 1, not '$musan'" >&2; exit 2; }
[[ $lm_max_lines == all || $lm_max_lines =~ ^[1-9][0-9]*$ ]] || {
  echo "LM_MAX_LINES must be a number of lines or all, not '$lm_max_lines'" >&2; exit 2; }
[[ $lm_beam =~ ^[1-9][0-9]*$ ]] || { echo "LM_BEAM must be a beam size, not '$lm_beam'" >&2; exit 2; }
manifests=$data/manifests
cuts() { echo "$manifests/librispeech_cuts_$1.jsonl.gz"; }
join() { local IFS=,; echo "$*"; }

case $parts in
  all) download=librispeech; train_parts=(train-clean-100 train-clean-360 train-other-500)
       dev_parts=(dev-clean dev-other); test_parts=(test-clean test-other) ;;
  mini) download=mini_librispeech; train_parts=(train-clean-5); dev_parts=(dev-clean-2)
        test_parts=(dev-clean-2) ;;
  *) echo "PARTS must be all or mini, not '$parts'" >&2; exit 2 ;;
esac
# The experiment's config with the overrides, resolved where a stage needs a key of it
# (`setting KEY`): its front end names stored features, a streaming preset's statistics
# (stage 5) and its ONNX export (stage 10).
config=
read_config() {
  [[ -n $config ]] || config=$(resolved_config experiment="$experiment" data_dir="$data" "${train_args[@]}")
}
frontend=kaldi
if [[ $features == precomputed ]]; then read_config; frontend=$(setting data.features.frontend); fi
feats=feats; [[ $frontend == kaldi ]] || feats=$frontend-feats
# the training manifests: with speed perturbation the -sp ones; with stored features -feats
# (-librosa-feats for the librosa front end)
train_name() { local n=$1; [[ $speed_perturb == 1 ]] && n=$n-sp; [[ $features == precomputed ]] && n=$n-$feats; echo "$n"; }
dev_name() { local n=$1; [[ $features == precomputed ]] && n=$n-$feats; echo "$n"; }
train_cuts=(); for p in "${train_parts[@]}"; do train_cuts+=("$(cuts "$(train_name "$p")")"); done
dev_cuts=(); for p in "${dev_parts[@]}"; do dev_cuts+=("$(cuts "$(dev_name "$p")")"); done
tokenizer=$data/tokenizer/bpe$vocab_size.model
data_args=(
  experiment="$experiment" data_dir="$data" "data.tokenizer=$tokenizer"
  "data.train_cuts=[$(join "${train_cuts[@]}")]" "data.valid_cuts=[$(join "${dev_cuts[@]}")]"
  "data.test_cuts=[$(cuts "${test_parts[0]}")]" "data.features.source=$features"
)
shar_note=; [[ $shar == 1 ]] && shar_note=", Shar shards: $data/shar"
musan_cuts=$manifests/musan_cuts.jsonl.gz
musan_note=()
if run 2 && [[ $musan == 1 ]]; then
  musan_note=("musan: downloads MUSAN (11 GB) into $data/musan unless it is there, writes $musan_cuts")
elif run 2; then
  musan_note=("musan: skipped (MUSAN=1 downloads MUSAN, 11 GB, for training with noise)")
fi
end_dry_run "${musan_note[@]}" \
  "parts: $parts (training on ${train_parts[*]}), data: $data, exp: $exp$shar_note"

if run 0; then say 0
  asr-prepare-manifests --download-only --corpus-dir "$data/LibriSpeech" --parts "$download"
fi
if run 1; then say 1
  asr-prepare-manifests --corpus-dir "$data/LibriSpeech" --output-dir "$manifests" \
    --parts "${train_parts[@]}" "${dev_parts[@]}" "${test_parts[@]}"
fi
# MUSAN=1: MUSAN's music, speech and noise as a cut manifest, the noise data/augment=librispeech
# mixes into the training audio on the fly (asr-prepare-musan)
if run 2; then say 2
  if [[ $musan != 1 ]]; then
    echo "MUSAN=$musan: skipped (MUSAN=1 downloads MUSAN, 11 GB, and writes $musan_cuts for data/augment=librispeech)"
  elif [[ -f $musan_cuts ]]; then echo "$musan_cuts exists"; else
    asr-prepare-musan --corpus-dir "$data/musan" --download -o "$musan_cuts"
  fi
fi
if run 3; then say 3
  if [[ $speed_perturb != 1 ]]; then echo "SPEED_PERTURB=$speed_perturb: skipped"; fi
  for p in "${train_parts[@]}"; do
    [[ $speed_perturb == 1 ]] || break
    if [[ -f $(cuts "$p-sp") ]]; then echo "$(cuts "$p-sp") exists"; else
      asr-perturb-speed --cuts "$(cuts "$p")" --output "$(cuts "$p-sp")"
    fi
  done
fi
if run 4; then say 4
  if [[ -f $tokenizer ]]; then echo "$tokenizer exists"; else
    originals=(); for p in "${train_parts[@]}"; do originals+=("$(cuts "$p")"); done
    asr-train-tokenizer --vocab-size "$vocab_size" --output "$tokenizer" --cuts "${originals[@]}"
  fi
fi
if run 5; then say 5
  if [[ $features != precomputed ]]; then echo "FEATURES=$features: computed while training"; fi
  for p in "${train_parts[@]}" "${dev_parts[@]}"; do
    [[ $features == precomputed ]] || break
    name=$(dev_name "$p"); [[ " ${train_parts[*]} " == *" $p "* ]] && name=$(train_name "$p")
    if [[ -f $(cuts "$name") ]]; then echo "$(cuts "$name") exists"; else
      asr-compute-features --cuts "$(cuts "${name%-$feats}")" --frontend "$frontend" \
        --output "$(cuts "$name")"
    fi
  done
  # the global statistics a streaming preset normalizes with (model.encoder.feature_stats)
  read_config
  feature_stats=$(setting model.encoder.feature_stats)
  if [[ -n $feature_stats && -f $feature_stats ]]; then echo "$feature_stats exists"
  elif [[ -n $feature_stats ]]; then  # of the original parts (speed copies add nothing)
    originals=(); for p in "${train_parts[@]}"; do originals+=("$(cuts "$(dev_name "$p")")"); done
    asr-feature-stats --cuts "${originals[@]}" --frontend "$(setting data.features.frontend)" --source "$features" \
      --output "$feature_stats"
  fi
  # SHAR=1: each training manifest as Shar shards (its audio; its stored features too)
  shar_fields=(recording); [[ $features == precomputed ]] && shar_fields+=(features)
  for p in "${train_parts[@]}"; do
    [[ $shar == 1 ]] || break
    shards=$data/shar/$(train_name "$p")
    if [[ -f $shards/shar_index.json ]]; then echo "$shards exists"; else
      asr-export-shar "$(cuts "$(train_name "$p")")" --fields "${shar_fields[@]}" -o "$shards"
    fi
  done
fi
sp_suffix=""; [[ $speed_perturb == 1 ]] && sp_suffix=-sp
bins=$data/bins-$(join "${train_parts[@]}")$sp_suffix.yaml
batch_sizes=$exp/batch_sizes.yaml
if run 6; then say 6
  if [[ -f $bins ]]; then echo "$bins exists"; else
    # duration bins x 2 token bins of equal totals, per-bucket tokens-per-second limits
    asr-estimate-bins "${train_cuts[@]}" --tokenizer "$tokenizer" \
      --num-buckets "$num_buckets" --num-token-buckets 2 -o "$bins"
  fi
fi
if run 7; then say 7
  if [[ -f $batch_sizes ]]; then echo "$batch_sizes exists"; else
    if [[ -z $batch_memory ]]; then
      batch_memory=$(python -c "import torch; p = torch.cuda.get_device_properties(0); print(f'{int(0.85 * p.total_memory)}B')" 2>/dev/null) || {
        echo "no GPU to size the batches on: set BATCH_MEMORY (e.g. 20GiB) and DEVICE" >&2; exit 1; }
    fi
    asr-oomptimizer "${data_args[@]}" "${train_args[@]}" --bins-file "$bins" \
      --memory-budget "$batch_memory" --device "$device" --rel-tolerance "$batch_tolerance" \
      -o "$batch_sizes"
  fi
fi
if run 8; then say 8
  # librispeech_streaming starts from the full-context model (init_from): trained first if
  # missing (its own batch sizes, decoding and export)
  read_config
  [[ -z $(setting init_from) ]] || train_missing_init librispeech_transducer bins export
  asr-train "${data_args[@]}" exp_dir="$exp" data.sampler.bins_file="$batch_sizes" "${train_args[@]}"
fi
# the model decoded and exported: the average of epochs EPOCH-AVG+1..EPOCH (as many as exist)
last_epoch() {
  [[ -d $exp/checkpoints ]] || return 0
  find "$exp/checkpoints" -name 'epoch=*.ckpt' | sed 's/.*epoch=\([0-9]*\)\.ckpt/\1/' | sort -n | tail -n 1
}
# Sets `pick` to asr-decode/asr-export's --epoch/--avg arguments; exits when there is no
# epoch to pick.
pick_model() {
  local epoch=${EPOCH:-$(last_epoch)}
  if [[ -z $epoch ]]; then
    echo "no epoch checkpoint (epoch=NN.ckpt) in $exp/checkpoints: run the train stage first, or set EXP" >&2
    exit 1
  fi
  [[ $epoch =~ ^[0-9]+$ ]] || { echo "EPOCH must be a number, not '$epoch'" >&2; exit 2; }
  epoch=$((10#$epoch))
  local n=$(( avg < epoch + 1 ? avg : epoch + 1 ))
  pick=(--epoch "$epoch" --avg "$n")
}
if run 9; then say 9
  pick_model
  for p in "${test_parts[@]}"; do
    for b in 1 "$beam"; do
      asr-decode "$exp/checkpoints" "$(cuts "$p")" "${pick[@]}" --beam-size "$b" \
        -o "$exp/decode-$p-beam$b"
    done
  done
fi
# Beam search of $1 hypotheses without and with the LM + LODR on the parts after it, one
# line each (stage 10's decodes).
lm_wers() {
  python - "$exp" "$@" <<'EOF'
import json
import sys
from pathlib import Path

exp, beam, parts = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
for part in parts:
    for name in (f"decode-{part}-beam{beam}", f"decode-{part}-beam{beam}-lm"):
        result = json.loads((exp / name / "wer.json").read_text())
        lm = result.get("language_model")
        fused = "without LM"
        if lm:
            fused = f"with LM + LODR (LM {Path(lm['lm']).name} x {lm['lm_weight']:g}"
            if "lodr" in lm:
                fused += f", LODR {Path(lm['lodr']).name} x {lm['lodr_weight']:g}"
            fused += ")"
        print(f"{part}, beam {beam}: {result['wer']:.2f}% {fused}")
EOF
}
# The language models of stage 10, over the tokenizer's pieces (named by it) in $data/lm.
lm_dir=$data/lm
lm_text=${lm_text:-$lm_dir/librispeech-lm-norm.txt.gz}
lm=$lm_dir/bpe${vocab_size}_${lm_order}gram_${lm_max_lines}lines.arpa.gz
lm_lines=(); [[ $lm_max_lines == all ]] || lm_lines=(--max-lines "$lm_max_lines")
lodr=$lm_dir/bpe${vocab_size}_lodr_2gram.arpa.gz
lm_args=(--lm "$lm" --lodr "$lodr")
[[ -n $lm_weight ]] && lm_args+=(--lm-weight "$lm_weight")
[[ -n $lodr_weight ]] && lm_args+=(--lodr-weight "$lodr_weight")
if run 10; then say 10
  [[ -f $tokenizer ]] || { echo "no tokenizer $tokenizer: run the tokenizer stage first" >&2; exit 1; }
  pick_model  # before the download: a model to decode with is there
  if [[ -f $lm ]]; then echo "$lm exists"; else
    asr-prepare-manifests --lm-text "$lm_text"  # downloaded unless it is there
    asr-train-lm "$lm_text" "${lm_lines[@]}" --tokenizer "$tokenizer" --order "$lm_order" -o "$lm"
  fi
  if [[ -f $lodr ]]; then echo "$lodr exists"; else  # the supervisions' text, no speed copies
    transcripts=(); for p in "${train_parts[@]}"; do
      transcripts+=("$manifests/librispeech_supervisions_$p.jsonl.gz"); done
    asr-train-lm "${transcripts[@]}" --tokenizer "$tokenizer" --order 2 -o "$lodr"
  fi
  for p in "${test_parts[@]}"; do
    without=$exp/decode-$p-beam$lm_beam
    if run 9 && (( lm_beam == beam )); then echo "$without: decoded by the decode stage"; else
      asr-decode "$exp/checkpoints" "$(cuts "$p")" "${pick[@]}" --beam-size "$lm_beam" -o "$without"
    fi
    asr-decode "$exp/checkpoints" "$(cuts "$p")" "${pick[@]}" --beam-size "$lm_beam" \
      "${lm_args[@]}" -o "$without-lm"
  done
  lm_wers "$lm_beam" "${test_parts[@]}"
fi
if run 11; then say 11
  pick_model
  asr-export "$exp/checkpoints" "${pick[@]}" -o "$exp/model.bundle.pt"
  # a streaming preset: its ONNX export for sherpa-onnx's online recognizer (docs/streaming.md)
  read_config
  if [[ -n $(setting model.encoder.streaming) ]]; then
    asr-export "$exp/checkpoints" "${pick[@]}" --format onnx -o "$exp/onnx"
  fi
fi
if run 12; then say 12
  pick_model
  python - "$exp" "${pick[*]}" "$beam" "$lm_beam" "${test_parts[@]}" <<'EOF'
import json
import sys
from pathlib import Path

exp, picked, beam, lm_beam, parts = (
    Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
)
rows = [f"Model: `{picked}` of {exp}/checkpoints (the same as {exp}/model.bundle.pt).", "",
        "| test set | search | WER % | RTFx |", "| --- | --- | --- | --- |"]
searches = {"1": "greedy"}  # the decode stage's, then the lm stage's
for b in (beam, lm_beam):
    searches.setdefault(b, f"beam {b}")
searches[f"{lm_beam}-lm"] = f"beam {lm_beam}, LM + LODR"
for part in dict.fromkeys(parts):
    for b, search in searches.items():
        result = exp / f"decode-{part}-beam{b}" / "wer.json"
        if result.is_file():
            wer = json.loads(result.read_text())
            rows.append(f"| {part} | {search} | {wer['wer']:.2f} | {wer['rtfx']} |")
rows += ["", "![training curves](training.png)", "", "![buckets and batch sizes](bins.png)"]
(exp / "results.md").write_text("\n".join(rows) + "\n")
print("\n".join(rows))
EOF
  asr-plot training "$exp" -o "$exp/training.png"
  asr-plot bins "$batch_sizes" --cuts "${train_cuts[@]}" -o "$exp/bins.png"
fi
ssl_exp=${SSL_EXP:-exp/librispeech_ssl_$ssl_objective}
if run 13; then say 13
  ssl_bins=$data/bins-$(join "${train_parts[@]}")$sp_suffix-audio.yaml
  if [[ -f $ssl_bins ]]; then echo "$ssl_bins exists"; else
    asr-estimate-bins "${train_cuts[@]}" --num-buckets "$num_buckets" -o "$ssl_bins"  # by duration
  fi
  ssl_args=(
    experiment="librispeech_ssl_$ssl_objective" data_dir="$data" exp_dir="$ssl_exp"
    "data.train_cuts=[$(join "${train_cuts[@]}")]" "data.valid_cuts=[$(join "${dev_cuts[@]}")]"
    "data.test_cuts=[]" "data.features.source=$features" "${pretrain_args[@]}"
  )
  if [[ -f $ssl_exp/batch_sizes.yaml ]]; then echo "$ssl_exp/batch_sizes.yaml exists"; else
    if [[ -z $batch_memory ]]; then
      batch_memory=$(python -c "import torch; p = torch.cuda.get_device_properties(0); print(f'{int(0.85 * p.total_memory)}B')" 2>/dev/null) || {
        echo "no GPU to size the batches on: set BATCH_MEMORY (e.g. 20GiB) and DEVICE" >&2; exit 1; }
    fi
    asr-oomptimizer "${ssl_args[@]}" --bins-file "$ssl_bins" --memory-budget "$batch_memory" \
      --device "$device" --rel-tolerance "$batch_tolerance" -o "$ssl_exp/batch_sizes.yaml"
  fi
  asr-train "${ssl_args[@]}" data.sampler.bins_file="$ssl_exp/batch_sizes.yaml" run_test=false
  asr-export "$ssl_exp/checkpoints" --best --encoder-only -o "$ssl_exp/encoder.pt"
fi
ft_exp=$exp-ft-$ssl_objective
if run 14; then say 14
  ft_cuts=(); for p in "${finetune_parts[@]}"; do ft_cuts+=("$(cuts "$(train_name "$p")")"); done
  asr-train "${data_args[@]}" exp_dir="$ft_exp" "data.train_cuts=[$(join "${ft_cuts[@]}")]" \
    data.sampler.bins_file="$batch_sizes" init_encoder_from="$ssl_exp/encoder.pt" \
    "${train_args[@]}"
  for p in "${test_parts[@]}"; do
    asr-decode "$ft_exp/checkpoints" "$(cuts "$p")" --best -o "$ft_exp/decode-$p-beam1"
  done
fi
