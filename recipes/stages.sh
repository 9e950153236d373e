# Sourced by the recipes' scripts: numbered, named stages and the command line they share.
#
#   names=(corpus manifests ...)     # the stages in order
#   stage=0; stop_stage=10           # defaults
#   source "$(dirname "$0")/../stages.sh"
#   parse_stages "$@"                # --stage S --stop-stage S [-- hydra overrides]
#   if run 3; then say 3; ...; fi
#
# A stage is given by name or number; the arguments after "--" land in `train_args`.
# `stage_label` (default "stage") starts each stage's banner.

to_number() {
  for i in "${!names[@]}"; do [[ "${names[$i]}" == "$1" ]] && { echo "$i"; return; }; done
  [[ "$1" =~ ^[0-9]+$ ]] && { echo "$1"; return; }
  echo "unknown stage '$1'; stages: ${names[*]}" >&2; exit 2
}

parse_stages() {
  train_args=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --stage) stage=$(to_number "$2"); shift 2 ;;
      --stop-stage) stop_stage=$(to_number "$2"); shift 2 ;;
      --) shift; train_args=("$@"); break ;;
      *) echo "usage: $0 [--stage S] [--stop-stage S] [-- hydra overrides]" >&2; exit 2 ;;
    esac
  done
}

run() { [[ $stage -le $1 && $stop_stage -ge $1 ]]; }
say() { printf '\n=== %s %s: %s (%d s elapsed) ===\n' "${stage_label:-stage}" "$1" "${names[$1]}" "$SECONDS"; }
