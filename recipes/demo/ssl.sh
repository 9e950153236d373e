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
# 1 subset (a fixed FRACTION of the training audio, chosen by SUBSET_SEED, with its
# transcripts), 2 pretrain (each of OBJECTIVES on all the training audio; the transcripts
# are not read), 3 encoders (asr-export --encoder-only of each pre-training's best.ckpt),
# 4 finetune (the demo transducer on the subset: from scratch at each of SCRATCH_LRS, and
# from each pre-trained encoder at FINETUNE_LR), 5 decode (test-clean WER of each
# fine-tuning's best.ckpt, chosen by dev WER), 6 compare (exp/demo_ssl/compare-seed<SEED>.json).
#
# One fine-tuning protocol for all (the demo preset's model, optimizer and batches, without
# its EMA: stage 5 decodes the trained weights of best.ckpt): STEPS
# optimizer steps, warm-up a tenth of them, the CTC-only warm-up scaled from the demo's
# 280 steps (about one epoch of its 2 hours) by FRACTION (or CTC_STEPS), validation every VAL_EPOCHS
# epochs of the subset, SEED for the fine-tuning runs (finetune_<run>-seed<SEED>: another
# SEED reuses the pre-trained encoders). The from-scratch baseline gets the same steps and
# the better (by dev WER) of SCRATCH_LRS. Extra arguments after "--" go to every
# asr-train of stages 2 and 4 (Hydra overrides); PRETRAIN_ARGS and FINETUNE_ARGS
# (space-separated overrides) to those of one stage. BATCH_SIZES: a batch-size file for the
# fine-tuning (default none: experiment=demo's shipped batches, asr/configs/batches/demo.yaml).
# Each stage skips what is already done.
set -euo pipefail

stage=0
stop_stage=6
data=${DATA:-data/demo}
exp=${EXP:-exp/demo_ssl}
fraction=${FRACTION:-0.1}
subset_seed=${SUBSET_SEED:-0}
seed=${SEED:-42}
pretrain_seed=${PRETRAIN_SEED:-42}
objectives=${OBJECTIVES-best_rq w2v_bert}
steps=${STEPS:-1000}
val_epochs=${VAL_EPOCHS:-4}
scratch_lrs=${SCRATCH_LRS-0.0015 0.003}  # empty: no from-scratch run
finetune_lr=${FINETUNE_LR:-0.0015}

names=(prepare subset pretrain encoders finetune decode compare)
stage_label="ssl stage"
source "$(dirname "$0")/../stages.sh"
parse_stages "$@"
here=$(dirname "$0")
manifests=$data/manifests
subset=$exp/subset/train-clean-100-feats-$fraction-seed$subset_seed.jsonl.gz
batch_sizes=${BATCH_SIZES:-}
bins_args=(); [[ -n $batch_sizes ]] && bins_args=(data.sampler.bins_file="$batch_sizes")
read -ra pretrain_args <<< "${PRETRAIN_ARGS:-}"
read -ra finetune_args <<< "${FINETUNE_ARGS:-}"
ctc_steps=${CTC_STEPS:-$(python -c "import sys; print(round(280 * float(sys.argv[1])))" "$fraction")}
finetune_runs=()
for lr in $scratch_lrs; do finetune_runs+=("scratch_lr$lr-seed$seed"); done
for objective in $objectives; do finetune_runs+=("$objective-seed$seed"); done
end_dry_run "data: $data, exp: $exp, fine-tuning runs: ${finetune_runs[*]}"

if run 0; then say 0
  DATA=$data "$here/run.sh" --stop-stage batch-sizes
fi
if run 1; then say 1
  if [[ -f $subset ]]; then echo "$subset exists"; else
    mkdir -p "$exp/subset"
    asr-subset-cuts "$manifests/librispeech_cuts_train-clean-100-feats.jsonl.gz" \
      --fraction "$fraction" --seed "$subset_seed" -o "$subset" | tee "$exp/subset/summary.json"
  fi
fi
if run 2; then say 2
  for objective in $objectives; do
    if [[ -f $exp/pretrain_$objective/wall_seconds ]]; then  # written when it ended
      echo "$exp/pretrain_$objective exists"; continue
    fi
    began=$SECONDS
    asr-train experiment="demo_ssl_$objective" data_dir="$data" seed="$pretrain_seed" \
      exp_dir="$exp/pretrain_$objective" debug.step_times_dir="$exp/pretrain_$objective/step_times" \
      "${pretrain_args[@]}" "${train_args[@]}"
    echo $((SECONDS - began)) > "$exp/pretrain_$objective/wall_seconds"
  done
fi
if run 3; then say 3
  for objective in $objectives; do
    asr-export "$exp/pretrain_$objective/checkpoints/best.ckpt" --encoder-only \
      -o "$exp/pretrain_$objective/encoder.pt"
  done
fi
if run 4; then say 4
  for name in "${finetune_runs[@]}"; do
    if [[ -f $exp/finetune_$name/wall_seconds ]]; then  # written when it ended
      echo "$exp/finetune_$name exists"; continue
    fi
    case $name in
      scratch_lr*) lr=${name#scratch_lr}; lr=${lr%-seed*}; init=null ;;
      *) lr=$finetune_lr; init=$exp/pretrain_${name%-seed*}/encoder.pt ;;
    esac
    began=$SECONDS
    # the Kaldi filterbank, as the pre-training (experiment=demo's own is the librosa one)
    asr-train experiment=demo data_dir="$data" seed="$seed" exp_dir="$exp/finetune_$name" \
      "data.train_cuts=[$subset]" data.features.frontend=kaldi \
      "data.valid_cuts=[$manifests/librispeech_cuts_dev-clean-feats.jsonl.gz]" "${bins_args[@]}" \
      init_encoder_from="$init" optim.lr="$lr" \
      trainer.max_steps="$steps" trainer.max_epochs=100000 \
      trainer.check_val_every_n_epoch="$val_epochs" \
      optim.scheduler.warmup_steps=$((steps / 10)) \
      model.loss.transducer_start_step="$ctc_steps" run_test=false '~ema' \
      debug.step_times_dir="$exp/finetune_$name/step_times" "${finetune_args[@]}" "${train_args[@]}"
    echo $((SECONDS - began)) > "$exp/finetune_$name/wall_seconds"
  done
fi
if run 5; then say 5
  for name in "${finetune_runs[@]}"; do
    asr-decode "$exp/finetune_$name/checkpoints/best.ckpt" \
      "$manifests/librispeech_cuts_test-clean.jsonl.gz" -o "$exp/finetune_$name/decode-test-clean"
  done
fi
if run 6; then say 6
  python -m asr.benchmarks.ssl_compare "$exp" --subset "$subset" --steps "$steps" \
    --seed "$seed" --ctc-steps "$ctc_steps" --runs "${finetune_runs[@]}" \
    -o "$exp/compare-seed$seed.json"
fi
