# Sourced by the recipes' scripts: numbered, named stages and the command line they share.
#
#   names=(corpus manifests ...)     # the stages in order
#   stage=0; stop_stage=10           # defaults
#   source "$(dirname "$0")/../stages.sh"
#   shar=${SHAR:-0}                  # only in a recipe that offers --shar (sets shar=1)
#   parse_stages "$@"                # --stage S --stop-stage S --dry-run [-- hydra overrides]
#   end_dry_run                      # with --dry-run: list the stages, exit 0
#   if run 3; then say 3; ...; fi
#
# A stage is given by name or number; the arguments after "--" land in `train_args`.
# `stage_label` (default "stage") starts each stage's banner.
#
# The project's commands (asr-train, ...) need not be on PATH: when they are not, the
# checkout's .venv (made by `make install`, `make demo`, ...) is put on it.

recipes_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # the checkout the recipes are in

# asr-train on PATH, else the checkout's .venv/bin put first on it, else exit 2.
find_environment() {
  command -v asr-train >/dev/null && return
  if [[ -x $recipes_root/.venv/bin/asr-train ]]; then
    PATH=$recipes_root/.venv/bin:$PATH
    echo "using $recipes_root/.venv (asr-train was not on PATH)" >&2
    return
  fi
  echo "asr-train not found: run \"make install\" in $recipes_root (it creates .venv), or activate the environment where asr is installed" >&2
  exit 2
}

# The number of stage $2 (a name or number), given to option $1.
to_number() {
  for i in "${!names[@]}"; do [[ "${names[$i]}" == "$2" ]] && { echo "$i"; return; }; done
  [[ "$2" =~ ^[0-9]+$ ]] && (( 10#$2 < ${#names[@]} )) && { echo "$((10#$2))"; return; }
  local what="unknown stage '$2'"; [[ -z $2 || $2 == -* ]] && what="$1 needs a stage"
  echo "$what; stages: ${names[*]} (or 0-$(( ${#names[@]} - 1 )))" >&2; exit 2
}

unknown_argument() {
  local shar_option=; [[ -n ${shar-} ]] && shar_option=" [--shar]"
  echo "unknown argument '$1'; usage: $0 [--stage S] [--stop-stage S] [--dry-run]$shar_option [-- hydra overrides]" >&2
  exit 2
}

parse_stages() {
  train_args=()
  dry_run=
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --stage) stage=$(to_number "$1" "${2-}"); shift 2 ;;
      --stop-stage) stop_stage=$(to_number "$1" "${2-}"); shift 2 ;;
      --dry-run) dry_run=1; shift ;;
      --shar) [[ -n ${shar-} ]] || unknown_argument "$1"; shar=1; shift ;;
      --) shift; train_args=("$@"); break ;;
      *) unknown_argument "$1" ;;
    esac
  done
  if (( stage > stop_stage )); then
    echo "no stage to run: --stage ${names[$stage]} ($stage) is after --stop-stage ${names[$stop_stage]} ($stop_stage)" >&2
    exit 2
  fi
  find_environment
}

# With --dry-run: the stages that would run and the overrides after "--" (and any lines
# given as arguments), then exit 0 before anything is run or written.
end_dry_run() {
  [[ -n $dry_run ]] || return 0
  echo "dry run: $0 would run"
  local i
  for i in "${!names[@]}"; do
    if run "$i"; then printf '  %s %d: %s\n' "${stage_label:-stage}" "$i" "${names[$i]}"; fi
  done
  if [[ ${#train_args[@]} -gt 0 ]]; then
    printf 'train overrides:'; printf ' %q' "${train_args[@]}"; echo
  else
    echo "train overrides: none"
  fi
  local line; for line in "$@"; do echo "$line"; done
  exit 0
}

run() { [[ $stage -le $1 && $stop_stage -ge $1 ]]; }
say() { printf '\n=== %s %s: %s (%d s elapsed) ===\n' "${stage_label:-stage}" "$1" "${names[$1]}" "$SECONDS"; }

# The training config with these overrides, resolved (-p '' prints it whole whatever Hydra
# flags the overrides hold); a mistyped key fails here, before any stage runs.
resolved_config() { asr-train "$@" --cfg job --resolve -p ''; }
# A key of "$config" (dotted), printed plainly; nothing when it is null or missing.
setting() {
  python -c 'import sys, yaml
value = yaml.safe_load(sys.stdin)
for key in sys.argv[1].split("."):
    value = value.get(key) if isinstance(value, dict) else None
if value is not None:
    print(value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=None).strip())' \
    "$1" <<< "$config"
}

# A preset that starts from a trained model (init_from: the streaming presets start from the
# full-context ones) has that model trained first when its bundle is missing: this recipe
# with EXPERIMENT=$1 and EXP its directory, from stage $2 to stage $3. Not when asr-train
# only prints its config (Hydra's --cfg among the overrides).
train_missing_init() {
  local init; init=$(setting init_from)
  [[ -z $init || -f $init || " ${train_args[*]} " == *" --cfg "* ]] && return 0
  [[ $init == */model.bundle.pt ]] || { echo "init_from=$init: no such file" >&2; exit 2; }
  echo "init_from=$init is missing: training experiment=$1 into $(dirname "$init") first"
  EXPERIMENT=$1 EXP=$(dirname "$init") bash "$0" --stage "$2" --stop-stage "$3"
  printf '\n=== %s: back to experiment=%s, which starts from it (%d s elapsed) ===\n' \
    "$init" "$experiment" "$SECONDS"
}
