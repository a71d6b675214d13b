#!/bin/sh
# run_oracle.sh - installs the oracle's npm packages (npm ci, into the build
# dir, once per package-lock.json) and runs oracle.mjs against tokcheck.
#   run_oracle.sh SRC_DIR WORK_DIR TOKCHECK [--bench] [--only NAME]
#   run_oracle.sh SRC_DIR WORK_DIR CHATCHECK --chat [--bench]   (chat_oracle.mjs)
# Exits 77 (skip) only when node/npm are missing or the npm registry cannot
# be reached.
set -u
src=$1
work=$2
tokcheck=$3
shift 3
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "SKIP: node/npm not installed (tools/install-deps.sh --test installs nodejs npm)"
    exit 77
fi
mkdir -p "$work" || exit 1
if ! cmp -s "$src/package-lock.json" "$work/.installed-lock" ||
    [ ! -f "$work/node_modules/@huggingface/tokenizers/package.json" ] ||
    [ ! -f "$work/node_modules/@huggingface/jinja/package.json" ]; then
    cp "$src/package.json" "$src/package-lock.json" "$work/" || exit 1
    # one installer at a time per work dir
    if ! (
        flock -w 280 9 || exit 1
        timeout 270 npm ci --prefix "$work" --no-audit --no-fund --loglevel=error
    ) 9>"$work/.lock"; then
        if ! timeout 30 npm ping >/dev/null 2>&1; then
            echo "SKIP: the npm registry cannot be reached (npm ping failed); the oracle needs @huggingface/tokenizers"
            exit 77
        fi
        echo "run_oracle: npm ci failed although the registry answers" >&2
        exit 1
    fi
    cp "$src/package-lock.json" "$work/.installed-lock" || exit 1
fi
if [ "${1:-}" = "--chat" ]; then
    # the chat template oracle: $3 is chatcheck
    shift
    exec node "$src/chat_oracle.mjs" --chatcheck "$tokcheck" --modules "$work/node_modules" \
        --dir "$src" --out "$work/chat-out" "$@"
fi
exec node "$src/oracle.mjs" --tokcheck "$tokcheck" --modules "$work/node_modules" \
    --corpus "$src/corpus.json" --out "$work/out" "$@"
