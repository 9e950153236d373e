#!/usr/bin/env bash
# The demo trained with and without on-the-fly augmentation (speed, volume, reverberation,
# noise: experiment=demo_augment, data/augment=demo), both decoded on test-clean and on
# noisy and reverberant copies of it made with noise types that training never hears
# (docs/data.md "Augmentation"; figures in recipes/demo/RESULTS.md).
#
#   recipes/demo/augment.sh                      # every stage
#   recipes/demo/augment.sh --stage decode       # from a stage on (name or number)
#   recipes/demo/augment.sh --dry-run            # the stages it would run; runs nothing
#
# --dry-run lists the stages it would run, the overrides after "--", the models and the
# test sets, then exits: nothing is run or written. The project's .venv (make install) is
# used when asr-train is not on PATH (recipes/stages.sh).
#
# Stages: 0 prepare (recipes/demo/run.sh's corpus .. features, each skipped when done),
# 1 noise (asr-make-demo-noise: the noise corpus, its training types white, pink, tones and
# babble, its held-out types brown, clicks and chatter), 2 testsets (asr-mix-noise: test-clean
# with held-out noise at each of SNRS dB, reverberated in generated rooms, and reverberated
# with noise at 10 dB), 3 train (each of MODELS: none = experiment=demo as shipped, 7 epochs;
# none_12ep = the same trained as long as augment; augment = experiment=demo_augment, 12
# epochs; through run.sh's train stage into EXP/<model>), 4 decode (greedy,
# the EMA of each model's last.ckpt, on every test set), 5 compare (EXP/compare.json: WER per
# model and test set, each model's training time per step).
#
# Environment: DATA [data/demo], EXP [exp/demo_augment_compare], MODELS [none none_12ep augment],
# SNRS [20 10 5], TEST_SEED [0] (the noise and rooms of the test sets), NOISE_CLIPS [24]
# (clips per noise type). Extra arguments after "--" go to every asr-train of stage 3 (Hydra
# overrides). Each stage skips what is done.
set -euo pipefail

stage=0
stop_stage=5
data=${DATA:-data/demo}
exp=${EXP:-exp/demo_augment_compare}
models=${MODELS-none none_12ep augment}
snrs=${SNRS-20 10 5}
test_seed=${TEST_SEED:-0}
noise_clips=${NOISE_CLIPS:-24}

names=(prepare noise testsets train decode compare)
stage_label="augment stage"
source "$(dirname "$0")/../stages.sh"
parse_stages "$@"
here=$(dirname "$0")
manifests=$data/manifests
clean=$manifests/librispeech_cuts_test-clean.jsonl.gz
heldout=$manifests/noise_cuts_test.jsonl.gz
testsets=(test-clean)
for snr in $snrs; do testsets+=("test-clean-snr$snr"); done
testsets+=(test-clean-reverb test-clean-reverb-snr10)
declare -A experiments=([none]=demo [none_12ep]=demo [augment]=demo_augment)
declare -A model_args=([none_12ep]=trainer.max_epochs=12)
for model in $models; do
  [[ -n ${experiments[$model]:-} ]] || {
    echo "MODELS: unknown model '$model' (none, none_12ep, augment)" >&2; exit 2; }
done
end_dry_run "data: $data, exp: $exp" "models: $models" "test sets: ${testsets[*]}"

if run 0; then say 0
  DATA=$data "$here/run.sh" --stop-stage features
fi
if run 1; then say 1
  asr-make-demo-noise "$data" --clips-per-type "$noise_clips"
fi
if run 2; then say 2
  mix() {  # name, asr-mix-noise arguments
    local out=$manifests/librispeech_cuts_$1.jsonl.gz
    if [[ -f $out ]]; then echo "$out exists"; return; fi
    asr-mix-noise "$clean" -o "$out" --seed "$test_seed" "${@:2}"
  }
  for snr in $snrs; do mix "test-clean-snr$snr" --noise "$heldout" --snr "$snr"; done
  mix test-clean-reverb --reverb
  mix test-clean-reverb-snr10 --reverb --noise "$heldout" --snr 10
fi
if run 3; then say 3
  for model in $models; do
    if [[ -f $exp/$model/wall_seconds ]]; then echo "$exp/$model exists"; continue; fi
    began=$SECONDS
    EXPERIMENT=${experiments[$model]} EXP=$exp/$model DATA=$data \
      "$here/run.sh" --stage train --stop-stage train -- ${model_args[$model]:-} \
      debug.step_times_dir="$exp/$model/step_times" "${train_args[@]}"
    echo $((SECONDS - began)) > "$exp/$model/wall_seconds"
  done
fi
if run 4; then say 4
  for model in $models; do
    for testset in "${testsets[@]}"; do
      out=$exp/$model/decode-$testset
      if [[ -f $out/wer.json ]]; then echo "$out exists"; continue; fi
      asr-decode "$exp/$model/checkpoints/last.ckpt" "$manifests/librispeech_cuts_$testset.jsonl.gz" \
        --ema -o "$out"
    done
  done
fi
if run 5; then say 5
  python -m asr.benchmarks.augment_compare "$exp" --models $models --testsets "${testsets[@]}" \
    -o "$exp/compare.json"
fi
