#!/bin/sh
# entrypoint.sh - the image's entry point: the first argument picks the role.
#   router|prefill|decode|frontend ARGS...  -> exec kvrail-ROLE ARGS...
#   anything else (kvrail, kvrail-router, sh, ...) -> exec it as given
#   -OPTION ... (e.g. --version)  -> exec kvrail -OPTION ...
#   no argument -> kvrail --help
# e.g. podman run kvrail decode --config /etc/kvrail/cluster.yaml --node decode0
set -e
case "${1:-}" in
"") exec kvrail --help ;;
router|prefill|decode|frontend)
    role=$1
    shift
    exec "kvrail-$role" "$@"
    ;;
-*) exec kvrail "$@" ;;
*) exec "$@" ;;
esac
