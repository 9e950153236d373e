#!/usr/bin/env bash
# Demo recipe: a synthetic LibriSpeech-layout corpus -> Conformer-Transducer -> WER.
#
#   recipes/demo/run.sh                       # every stage
#   recipes/demo/run.sh --stage train         # from a stage on (name or number)
#   recipes/demo/run.sh --stage 4 --stop-stage 4
#
# Stages: 0 corpus, 1 manifests, 2 tokenizer, 3 features, 4 train, 5 decode, 6 export,
# 7 transcribe. Each stage skips work already done, so re-running is cheap; extra
# arguments after "--" go to asr-train (Hydra overrides), e.g. -- trainer.max_epochs=2.
set -euo pipefail

stage=0
stop_stage=7
data=${DATA:-data/demo}
exp=${EXP:-exp/demo}
train_hours=${TRAIN_HOURS:-2}
vocab_size=128
train_args=()

names=(corpus manifests tokenizer features train decode export transcribe)
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
say() { printf '\n=== stage %s: %s (%d s elapsed) ===\n' "$1" "${names[$1]}" "$SECONDS"; }
manifests=$data/manifests
cuts() { echo "$manifests/librispeech_cuts_$1.jsonl.gz"; }

if run 0; then say 0
  asr-make-demo-corpus "$data" --train-hours "$train_hours"
fi
if run 1; then say 1
  python -m asr.data.corpus --corpus-dir "$data/LibriSpeech" --output-dir "$manifests"
fi
if run 2; then say 2
  model=$data/tokenizer/bpe$vocab_size.model
  if [[ -f $model ]]; then echo "$model exists"; else
    python -m asr.data.tokenizer --cuts "$(cuts train-clean-100)" --vocab-size $vocab_size --output "$model"
  fi
fi
if run 3; then say 3
  for part in train-clean-100 dev-clean; do
    python -m asr.data.features --cuts "$(cuts $part)" --output "$(cuts $part-feats)"
  done
fi
if run 4; then say 4
  asr-train experiment=demo data_dir="$data" exp_dir="$exp" "${train_args[@]}"
fi
if run 5; then say 5
  asr-decode "$exp/checkpoints/last.ckpt" "$(cuts test-clean)" -o "$exp/decode-test-clean"
fi
if run 6; then say 6
  asr-export "$exp/checkpoints/last.ckpt" --average 1 -o "$exp/model.bundle.pt"
fi
if run 7; then say 7
  wav=$(find "$data/LibriSpeech/test-clean" -name '*.flac' | sort | head -n 1)
  echo "reference: $(grep "$(basename "$wav" .flac)" "$(dirname "$wav")"/*.trans.txt | cut -d' ' -f2-)"
  asr-transcribe "$exp/model.bundle.pt" "$wav"
fi
if [[ -f $exp/decode-test-clean/wer.json ]]; then
  printf '\nTest WER (test-clean of the demo corpus): %s%%\n' \
    "$(python -c "import json,sys;print(json.load(open(sys.argv[1]))['wer'])" "$exp/decode-test-clean/wer.json")"
fi
