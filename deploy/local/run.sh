#!/bin/sh
# deploy/local/run.sh - the README's main command: installs what kvrail needs
# (apt-get), builds it, generates the tiny model, starts the one-machine
# default cluster (router + 1 prefill + 1 decode, deploy/local/cluster.yaml),
# generates text through the router, shows the cluster status (KV bytes moved
# prefill -> decode and at what rate) and stops the cluster.
#   deploy/local/run.sh [PROMPT]
set -e
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
# default: a prompt of about a thousand tokens, so that the KV push is visible
PARA="Prefill nodes run the prompt through the model and build its KV cache; decode nodes hold the pool and generate. "
PROMPT=${1:-"$PARA$PARA$PARA$PARA$PARA$PARA$PARA$PARA$PARA$PARA$PARA$PARA The quick brown fox"}
CONFIG=deploy/local/cluster.yaml

tools/install-deps.sh
[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build >/dev/null
BIN=$ROOT/build

MODEL=.models/tiny
if [ ! -f "$MODEL/config.json" ]; then
    mkdir -p "$MODEL"
    "$BIN/tools/mkmodel/kvrail-mkmodel" --out "$MODEL" --seed 1 >/dev/null
fi

CLIENT=$(/usr/bin/python3 -c "import yaml;print(yaml.safe_load(open('$CONFIG'))['router']['client'])" 2>/dev/null || echo tcp://127.0.0.1:7700)
LOG=$(mktemp -t kvrail-up.XXXXXX)
"$BIN/tools/kvrail/kvrail" up "$CONFIG" >"$LOG" 2>&1 &
UP=$!
cleanup() {
    kill -TERM "$UP" 2>/dev/null || true
    wait "$UP" 2>/dev/null || true
}
trap cleanup EXIT INT TERM

# wait (bounded) until the router reports a live prefill and decode node
i=0
until "$BIN/tools/kvrail/kvrail" status --router "$CLIENT" --json 2>/dev/null |
    python3 -c "import json,sys; s=json.load(sys.stdin); r=[n.get('role') for n in s.get('nodes',[]) if n.get('alive',True)]; sys.exit(0 if 'prefill' in r and 'decode' in r else 1)" 2>/dev/null; do
    i=$((i + 1))
    if [ $i -gt 100 ] || ! kill -0 "$UP" 2>/dev/null; then
        echo "run.sh: the cluster did not come up within 20 s; its log:" >&2
        cat "$LOG" >&2
        exit 1
    fi
    sleep 0.2
done

echo "== prompt (${#PROMPT} characters): $(printf %s "$PROMPT" | cut -c1-100)..."
echo "== generated (streamed through the router, prefilled on prefill0, decoded on decode0):"
"$BIN/tools/kvrail/kvrail" generate --router "$CLIENT" --max-tokens 48 --temperature 0 "$PROMPT"
echo "(the tiny model's weights are random, so the text is noise; what matters is that"
echo " the cluster's tokens are exactly those of the single-process reference:)"
A=$("$BIN/tools/kvrail/kvrail" generate --router "$CLIENT" --max-tokens 48 --temperature 0 --json "$PROMPT" |
    python3 -c "import json,sys; print([json.loads(l)['token_id'] for l in sys.stdin if 'token_id' in l])")
B=$("$BIN/tools/kvrail/kvrail" run --model "$MODEL" --max-tokens 48 --temperature 0 --json --prompt "$PROMPT" |
    python3 -c "import json,sys; print([json.loads(l)['token_id'] for l in sys.stdin if 'token_id' in l])")
if [ "$A" = "$B" ]; then
    echo "== cluster == kvrail run: identical, $(echo "$A" | tr ',' '\n' | wc -l) tokens"
else
    echo "== MISMATCH: cluster $A" >&2
    echo "==           run     $B" >&2
    exit 1
fi
echo
echo "== cluster status:"
"$BIN/tools/kvrail/kvrail" status --router "$CLIENT"
