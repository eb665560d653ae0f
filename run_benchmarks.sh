#!/usr/bin/env bash
# tunematrix: run (or preview) the fine-tuning benchmark matrix.
#
# usage: bash run_benchmarks.sh [--frameworks FILE]... [NUM_GPUS_MATRIX] [RESULT_DIR] [SCENARIOS_CONFIG] [SCENARIOS_FILTER]
#    or: bash run_benchmarks.sh [--frameworks FILE]... NUM_GPUS_MATRIX EFFECTIVE_BS_MATRIX RESULT_DIR SCENARIOS_CONFIG SCENARIOS_FILTER
#
#   --frameworks FILE    framework definitions: a YAML file with a frameworks: mapping,
#                        or fms-acceleration's sample-configurations/CONTENTS.yaml as it
#                        is (each shortname a framework); repeatable; before the positionals
#   NUM_GPUS_MATRIX      GPU counts, e.g. "1 2 4"; on a machine without GPUs, process
#                        counts (default: "1 2" capped at the GPUs found; "1" without a GPU)
#   EFFECTIVE_BS_MATRIX  effective batch sizes, e.g. "4 8" (the fms-acceleration script's
#                        second argument: a second argument made only of integers is this;
#                        write a results folder named only with digits as ./2024)
#   RESULT_DIR           results folder (default: results)
#   SCENARIOS_CONFIG     scenarios file (default: scenarios.yaml beside this script)
#   SCENARIOS_FILTER     scenario names or patterns, space or comma separated; none (or
#                        empty) means every non-slow scenario for this machine
#
# environment:
#   DRY_RUN=true              print the matrix and the exact commands; write nothing
#   NO_OVERWRITE=true         resume: skip experiments whose result is already ok
#   NO_DATA_PROCESSING=true   train on the dataset file as it is
#   PRUNE=false               launch every experiment (as --no-prune); by default one
#                             certain to run out of memory after a smaller one of its
#                             family did is recorded as pruned, not launched
#   CHECK=false               launch without checking every cell against the installed
#                             libraries and finding every model first (as --no-check)
#   STOP_EARLY=false          launch every experiment (as --no-stop-early); by default,
#                             once two cells of one model, trainer and framework failed
#                             with the same error, the others like them are spared
#   PROFILE=true              profile every cell (as --profile): a trace per rank in
#                             runs/<id>/profile/ and the communication columns
#   MEASURE_UNTIL=steps|steady  how long each cell runs (as --until): its fixed max_steps
#                             (default), or until its mean step time is known to
#                             MEASURE_PRECISION (default 0.02: ±2%), after at least
#                             MEASURE_MIN_STEPS measured steps (10), at most
#                             MEASURE_MAX_STEPS steps (200)
#   LAUNCH=cell|family        a launch per experiment (default; the file's launch:), or
#                             one launch per family: its experiments one after another,
#                             the start-up paid once (as --launch family)
#   MEMORY_LOGGING=all|nvidia|huggingface|hf-tracker   what measures memory (default: all)
#   EFFECTIVE_BS_MATRIX="4 8" effective batch sizes (default: the scenarios file's)
#   DEVICE=auto|gpu|cpu       plan for GPUs or the CPU (default: auto)
#   FRAMEWORKS=FILE           as --frameworks FILE
#   EXECUTOR=local|packed|slurm|ray  run here one job at a time (default), packed
#                             on this node's GPUs (as --pack), or submit each
#                             experiment as a SLURM job (options: the file's slurm:)
#                             or a Ray task (the file's ray:; RAY_ADDRESS)
#   PYTHON                    the interpreter to use (default: python3)
#
# examples:
#   DRY_RUN=true bash run_benchmarks.sh
#   bash run_benchmarks.sh "1 2" results scenarios.yaml standard-peft
#   bash run_benchmarks.sh "1 2" "4 8" results scenarios.yaml none
#   bash run_benchmarks.sh --frameworks CONTENTS.yaml "1 2" "4 8" results scenarios.yaml none
#   NO_OVERWRITE=true bash run_benchmarks.sh "1 2" results
#   EXECUTOR=slurm DEVICE=gpu bash run_benchmarks.sh "1 2 4 8" results
#   tox -e run-benches -- "1 2" results scenarios.yaml standard-peft
#
# This script is a thin wrapper over `python -m orchestrator plan|run`; see
# `python -m orchestrator run --help` for every option.
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

die() {
    echo "run_benchmarks.sh: error: $*" >&2
    exit 2
}

# true/false environment switches; anything else is a mistake worth stopping for
flag() {
    local name=$1 value=${!1:-false}
    case "${value,,}" in
        true | 1 | yes) return 0 ;;
        false | 0 | no | "") return 1 ;;
        *) die "$name must be true or false, got '$value'" ;;
    esac
}

FRAMEWORK_FILES=()
[ -z "${FRAMEWORKS:-}" ] || FRAMEWORK_FILES+=("$FRAMEWORKS")
while [ $# -gt 0 ]; do
    case "$1" in
        -h | --help)
            usage
            exit 0
            ;;
        --frameworks)
            [ $# -ge 2 ] && [ -n "$2" ] || die "--frameworks needs a file"
            FRAMEWORK_FILES+=("$2")
            shift 2
            ;;
        --frameworks=*)
            [ -n "${1#--frameworks=}" ] || die "--frameworks needs a file"
            FRAMEWORK_FILES+=("${1#--frameworks=}")
            shift
            ;;
        --) shift; break ;;
        -?*) die "unknown option '$1'; options (--frameworks FILE) come before the positional arguments" ;;
        *) break ;;
    esac
done
[ $# -le 5 ] || die "too many arguments ($#); see --help"

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)

# Two forms: fms-acceleration's script takes the effective batch sizes second
# (five arguments); its README, and ours, leave them out (four).
NUM_GPUS_MATRIX=${1-}
BS_MATRIX=${EFFECTIVE_BS_MATRIX:-}
if [ $# -ge 2 ] && [[ $2 =~ ^[[:space:],]*[0-9]+([[:space:],]+[0-9]+)*[[:space:],]*$ ]]; then
    if [ -n "${EFFECTIVE_BS_MATRIX:-}" ] && [ "$EFFECTIVE_BS_MATRIX" != "$2" ]; then
        die "effective batch sizes given twice: '$2' (2nd argument) and EFFECTIVE_BS_MATRIX='$EFFECTIVE_BS_MATRIX'; give one"
    fi
    BS_MATRIX=$2
    form="5 arguments: NUM_GPUS_MATRIX EFFECTIVE_BS_MATRIX RESULT_DIR SCENARIOS_CONFIG SCENARIOS_FILTER"
    shift 2
    set -- "$NUM_GPUS_MATRIX" "$@"
else
    form="4 arguments: NUM_GPUS_MATRIX RESULT_DIR SCENARIOS_CONFIG SCENARIOS_FILTER"
    if [ $# -ge 5 ]; then
        echo "run_benchmarks.sh: note: the 5th argument (columns to drop) is not needed;" \
            "benchmarks.csv drops constant columns itself" >&2
    fi
fi
RESULT_DIR=${2:-results}
SCENARIOS_CONFIG=${3:-$SCRIPT_DIR/scenarios.yaml}
SCENARIOS_FILTER=${4-}
# the fms-acceleration script's way of saying "no filter"
[ "${SCENARIOS_FILTER,,}" != none ] || SCENARIOS_FILTER=

args=(--scenarios "$SCENARIOS_CONFIG" --results "$RESULT_DIR" --device "${DEVICE:-auto}")
[ -z "$NUM_GPUS_MATRIX" ] || args+=(--num-gpus "$NUM_GPUS_MATRIX")
[ -z "$BS_MATRIX" ] || args+=(--effective-batch-size "$BS_MATRIX")
[ -z "$SCENARIOS_FILTER" ] || args+=(--filter "$SCENARIOS_FILTER")
for file in "${FRAMEWORK_FILES[@]}"; do args+=(--frameworks "$file"); done
if flag PROFILE; then args+=(--profile); fi
[ -z "${MEASURE_UNTIL:-}" ] || args+=(--until "$MEASURE_UNTIL")
[ -z "${MEASURE_PRECISION:-}" ] || args+=(--precision "$MEASURE_PRECISION")
[ -z "${MEASURE_MIN_STEPS:-}" ] || args+=(--min-steps "$MEASURE_MIN_STEPS")
[ -z "${MEASURE_MAX_STEPS:-}" ] || args+=(--max-steps "$MEASURE_MAX_STEPS")
[ $# -eq 0 ] || args+=(--note "run_benchmarks.sh read $form")

# Use the orchestrator next to this script, whatever is installed.
export PYTHONPATH="$SCRIPT_DIR${PYTHONPATH:+:$PYTHONPATH}"
PYTHON=${PYTHON:-python3}

case "${EXECUTOR:-local}" in
    local | packed | slurm | ray) ;;
    *) die "EXECUTOR must be local, packed, slurm or ray, got '${EXECUTOR}'" ;;
esac
case "${LAUNCH:-}" in
    "" | cell | family) ;;
    *) die "LAUNCH must be cell or family, got '${LAUNCH}'" ;;
esac

if flag DRY_RUN; then
    exec "$PYTHON" -m orchestrator plan "${args[@]}" --commands
fi

run_args=(--memory-logging "${MEMORY_LOGGING:-all}" --executor "${EXECUTOR:-local}")
if flag NO_OVERWRITE; then run_args+=(--resume); fi
if flag NO_DATA_PROCESSING; then run_args+=(--no-data-processing); fi
if [ -n "${PRUNE:-}" ] && ! flag PRUNE; then run_args+=(--no-prune); fi
if [ -n "${STOP_EARLY:-}" ] && ! flag STOP_EARLY; then run_args+=(--no-stop-early); fi
if [ -n "${CHECK:-}" ] && ! flag CHECK; then run_args+=(--no-check); fi
[ -z "${LAUNCH:-}" ] || run_args+=(--launch "$LAUNCH")
exec "$PYTHON" -m orchestrator run "${args[@]}" "${run_args[@]}"
