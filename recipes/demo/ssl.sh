#!/usr/bin/env bash
# Self-supervised pre-training on the demo corpus, then fine-tuning with few labels
# (docs/ssl.md; figures in recipes/demo/RESULTS.md).
#
#   recipes/demo/ssl.sh                          # every stage
#   recipes/demo/ssl.sh --stage finetune         # from a stage on (name or number)
#   recipes/demo/ssl.sh --stage 4 --stop-stage 4
#   recipes/demo/ssl.sh --dry-run --stage finetune   # the stages it would run; runs nothing
#
# --dry-run lists the stages it would run, the overrides after "--" and the fine-tuning runs,
# then exits: nothing is run or written. The project's .venv (make install) is used when
# asr-train is not on PATH (recipes/stages.sh).
#
# Stages: 0 prepare (recipes/demo/run.sh's corpus .. batch-sizes, each skipped when done),
# 1 unlabelled (UNLABELLED_HOURS of audio without transcripts beside the corpus:
# asr-make-demo-corpus --unlabelled-hours --add-to-existing, its manifest and Kaldi
# features; 0: none), 2 subset (a fixed FRACTION of the labelled training audio, chosen by
# SUBSET_SEED, with its transcripts), 3 pretrain (each of OBJECTIVES for PRETRAIN_EPOCHS
# epochs on the unlabelled part and the labelled part's audio; no transcript is read),
# 4 encoders (asr-export --encoder-only of each pre-training's best.ckpt), 5 finetune
# (experiment=demo_finetune on the subset: from scratch at each of SCRATCH_LRS, and from each
# pre-trained encoder at each of FINETUNE_LRS), 6 decode (test-clean WER of each
# fine-tuning's best.ckpt, chosen by dev WER), 7 compare (exp/demo_ssl/compare-seed<SEED>.json).
#
# One fine-tuning recipe for all, experiment=demo_finetune (docs/ssl.md): SpecAugment,
# dropout, STEPS optimizer steps, warm-up a tenth of them, the CTC-only warm-up scaled from
# the demo's 280 steps (about one epoch of its 2 hours) by FRACTION (or CTC_STEPS),
# validation every VAL_EPOCHS epochs of the subset, the checkpoint of the best dev WER. A
# pre-trained encoder is held for FREEZE_STEPS steps, then trained at ENCODER_LR_SCALE
# times the head's rate; from scratch there is nothing to protect (0 and 1). Every start's
# learning rate is the better by dev WER of its list. SEED seeds the fine-tuning runs
# (finetune_<start>_lr<LR>-seed<SEED>: another SEED reuses the pre-trained encoders).
# Extra arguments after "--" go to every asr-train of stages 3 and 5 (Hydra overrides);
# PRETRAIN_ARGS and FINETUNE_ARGS (space-separated overrides) to those of one stage.
# BATCH_SIZES: a batch-size file for the fine-tuning (default none: the shipped demo
# batches, asr/configs/batches/demo.yaml). Each stage skips what is already done.
set -euo pipefail

stage=0
stop_stage=7
data=${DATA:-data/demo}
exp=${EXP:-exp/demo_ssl}
train_hours=${TRAIN_HOURS:-2}  # run.sh's
unlabelled_hours=${UNLABELLED_HOURS:-20}
fraction=${FRACTION:-0.1}
subset_seed=${SUBSET_SEED:-0}
seed=${SEED:-42}
pretrain_seed=${PRETRAIN_SEED:-42}
pretrain_epochs=${PRETRAIN_EPOCHS:-1}
objectives=${OBJECTIVES-best_rq w2v_bert}
steps=${STEPS:-1000}
val_epochs=${VAL_EPOCHS:-4}
scratch_lrs=${SCRATCH_LRS-0.0015 0.003}  # empty: no from-scratch run
finetune_lrs=${FINETUNE_LRS-0.0015 0.003}
freeze_steps=${FREEZE_STEPS:-100}
encoder_lr_scale=${ENCODER_LR_SCALE:-0.5}

names=(prepare unlabelled subset pretrain encoders finetune decode compare)
stage_label="ssl stage"
source "$(dirname "$0")/../stages.sh"
parse_stages "$@"
here=$(dirname "$0")
manifests=$data/manifests
labelled_feats=$manifests/librispeech_cuts_train-clean-100-feats.jsonl.gz
unlabelled_cuts=$manifests/librispeech_cuts_train-unlabelled.jsonl.gz
unlabelled_feats=$manifests/librispeech_cuts_train-unlabelled-feats.jsonl.gz
subset=$exp/subset/train-clean-100-feats-$fraction-seed$subset_seed.jsonl.gz
pretrain_cuts=$labelled_feats
if [[ $unlabelled_hours != 0 ]]; then pretrain_cuts="$labelled_feats,$unlabelled_feats"; fi
batch_sizes=${BATCH_SIZES:-}
bins_args=(); [[ -n $batch_sizes ]] && bins_args=(data.sampler.bins_file="$batch_sizes")
read -ra pretrain_args <<< "${PRETRAIN_ARGS:-}"
read -ra finetune_args <<< "${FINETUNE_ARGS:-}"
ctc_steps=${CTC_STEPS:-$(python -c "import sys; print(round(280 * float(sys.argv[1])))" "$fraction")}
finetune_runs=()
for lr in $scratch_lrs; do finetune_runs+=("scratch_lr$lr-seed$seed"); done
for objective in $objectives; do
  for lr in $finetune_lrs; do finetune_runs+=("${objective}_lr$lr-seed$seed"); done
done
end_dry_run "data: $data, exp: $exp, unlabelled hours: $unlabelled_hours" \
  "pre-training cuts: $pretrain_cuts" "fine-tuning runs: ${finetune_runs[*]}"

if run 0; then say 0
  DATA=$data TRAIN_HOURS=$train_hours "$here/run.sh" --stop-stage batch-sizes
fi
if run 1; then say 1
  if [[ $unlabelled_hours == 0 ]]; then echo "UNLABELLED_HOURS=0: no unlabelled part"; else
    asr-make-demo-corpus "$data" --unlabelled-hours "$unlabelled_hours" --add-to-existing
    if [[ ! -f $unlabelled_cuts || $data/LibriSpeech/train-unlabelled/demo_corpus.json -nt $unlabelled_cuts ]]; then
      asr-prepare-manifests --corpus-dir "$data/LibriSpeech" --output-dir "$manifests"
    fi
    if [[ ! -f $unlabelled_feats || $unlabelled_cuts -nt $unlabelled_feats ]]; then
      asr-compute-features --cuts "$unlabelled_cuts" --frontend kaldi --output "$unlabelled_feats"
    fi
  fi
fi
if run 2; then say 2
  if [[ -f $subset ]]; then echo "$subset exists"; else
    mkdir -p "$exp/subset"
    asr-subset-cuts "$labelled_feats" \
      --fraction "$fraction" --seed "$subset_seed" -o "$subset" | tee "$exp/subset/summary.json"
  fi
fi
if run 3; then say 3
  for objective in $objectives; do
    if [[ -f $exp/pretrain_$objective/wall_seconds ]]; then  # written when it ended
      echo "$exp/pretrain_$objective exists"; continue
    fi
    began=$SECONDS
    asr-train experiment="demo_ssl_$objective" data_dir="$data" seed="$pretrain_seed" \
      exp_dir="$exp/pretrain_$objective" "data.train_cuts=[$pretrain_cuts]" \
      trainer.max_epochs="$pretrain_epochs" \
      debug.step_times_dir="$exp/pretrain_$objective/step_times" \
      "${pretrain_args[@]}" "${train_args[@]}"
    echo $((SECONDS - began)) > "$exp/pretrain_$objective/wall_seconds"
  done
fi
if run 4; then say 4
  for objective in $objectives; do
    asr-export "$exp/pretrain_$objective/checkpoints/best.ckpt" --encoder-only \
      -o "$exp/pretrain_$objective/encoder.pt"
  done
fi
if run 5; then say 5
  for name in "${finetune_runs[@]}"; do
    if [[ -f $exp/finetune_$name/wall_seconds ]]; then  # written when it ended
      echo "$exp/finetune_$name exists"; continue
    fi
    start=${name%_lr*}; lr=${name#*_lr}; lr=${lr%-seed*}
    if [[ $start == scratch ]]; then
      init=(init_encoder_from=null freeze_encoder_steps=0 encoder_lr_scale=1)
    else
      init=(init_encoder_from="$exp/pretrain_$start/encoder.pt"
        freeze_encoder_steps="$freeze_steps" encoder_lr_scale="$encoder_lr_scale")
    fi
    began=$SECONDS
    asr-train experiment=demo_finetune data_dir="$data" seed="$seed" exp_dir="$exp/finetune_$name" \
      "data.train_cuts=[$subset]" "${bins_args[@]}" "${init[@]}" optim.lr="$lr" \
      trainer.max_steps="$steps" trainer.check_val_every_n_epoch="$val_epochs" \
      optim.scheduler.warmup_steps=$((steps / 10)) model.loss.transducer_start_step="$ctc_steps" \
      debug.step_times_dir="$exp/finetune_$name/step_times" "${finetune_args[@]}" "${train_args[@]}"
    echo $((SECONDS - began)) > "$exp/finetune_$name/wall_seconds"
  done
fi
if run 6; then say 6
  for name in "${finetune_runs[@]}"; do
    asr-decode "$exp/finetune_$name/checkpoints/best.ckpt" \
      "$manifests/librispeech_cuts_test-clean.jsonl.gz" -o "$exp/finetune_$name/decode-test-clean"
  done
fi
if run 7; then say 7
  python -m asr.benchmarks.ssl_compare "$exp" --subset "$subset" --steps "$steps" \
    --seed "$seed" --ctc-steps "$ctc_steps" --runs "${finetune_runs[@]}" \
    --dev-cuts "$manifests/librispeech_cuts_dev-clean-feats.jsonl.gz" -o "$exp/compare-seed$seed.json"
fi
