#!/usr/bin/env bash
# LibriSpeech 960 h Conformer-Transducer (~100M parameters) on GPUs.
#
#   recipes/librispeech/run.sh                    # every stage
#   recipes/librispeech/run.sh --stage train -- trainer.devices=4
#
# Stages: 0 download, 1 manifests, 2 tokenizer, 3 train, 4 decode, 5 export.
# Needs internet for stage 0 (about 60 GB from openslr.org) and ~120 GB of disk.
set -euo pipefail

stage=0
stop_stage=5
data=${DATA:-data/librispeech}
exp=${EXP:-exp/librispeech_transducer}
vocab_size=1024
train_args=()

names=(download manifests tokenizer train decode export)
to_number() {
  for i in "${!names[@]}"; do [[ "${names[$i]}" == "$1" ]] && { echo "$i"; return; }; done
  [[ "$1" =~ ^[0-9]+$ ]] && { echo "$1"; return; }
  echo "unknown stage '$1'; stages: ${names[*]}" >&2; exit 2
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --stage) stage=$(to_number "$2"); shift 2 ;;
    --stop-stage) stop_stage=$(to_number "$2"); shift 2 ;;
    --) shift; train_args=("$@"); break ;;
    *) echo "usage: $0 [--stage S] [--stop-stage S] [-- hydra overrides]" >&2; exit 2 ;;
  esac
done
run() { [[ $stage -le $1 && $stop_stage -ge $1 ]]; }
say() { printf '\n=== stage %s: %s ===\n' "$1" "${names[$1]}"; }
manifests=$data/manifests
cuts() { echo "$manifests/librispeech_cuts_$1.jsonl.gz"; }

if run 0; then say 0
  asr-prepare-manifests --download-only --corpus-dir "$data/LibriSpeech"
fi
if run 1; then say 1
  asr-prepare-manifests --corpus-dir "$data/LibriSpeech" --output-dir "$manifests"
fi
if run 2; then say 2
  model=$data/tokenizer/bpe$vocab_size.model
  if [[ -f $model ]]; then echo "$model exists"; else
    asr-train-tokenizer --vocab-size $vocab_size --output "$model" --cuts \
      "$(cuts train-clean-100)" "$(cuts train-clean-360)" "$(cuts train-other-500)"
  fi
fi
if run 3; then say 3
  asr-train experiment=librispeech_transducer data_dir="$data" exp_dir="$exp" "${train_args[@]}"
fi
if run 4; then say 4
  for part in test-clean test-other; do
    asr-decode "$exp/checkpoints/last.ckpt" "$(cuts $part)" -o "$exp/decode-$part"
  done
fi
if run 5; then say 5
  asr-export "$exp/checkpoints/last.ckpt" --average 5 -o "$exp/model.bundle.pt"
fi
