#!/bin/sh
# The signing keys of a hivemux deployment (bus.signing) as the manifests mount them: made once
# in DIR and kept there (a rerun reuses every key in DIR and adds the missing ones), then
# created or updated in the cluster:
#   hivemux-key-<service>        Secret, `signing.key`: that service's private key only
#   hivemux-key-executor-nodes   Secret, `<node>.key` per GPU node: the key of executor/<node>;
#                                the DaemonSet mounts its own node's file alone (subPathExpr)
#   hivemux-keyring              ConfigMap, `keyring.json`: every signer's public keys
# The nodes: those labelled hivemux.io/gpu-node=true, or EXECUTOR_NODES (names, space-separated).
# DIR/cli.key stays here, the operator's CLI key (HIVEMUX_SIGNING_KEY=DIR/cli.key
# HIVEMUX_KEYRING=DIR/keyring.json hivemux ...). Keep DIR as safe as the cluster's Secrets.
#   deploy/kubernetes/signing-keys.sh ./hivemux-keys     (NAMESPACE=hivemux, PYTHON=python)
set -eu
DIR="${1:?usage: signing-keys.sh DIR  (the keys are made in DIR once and kept)}"
NAMESPACE="${NAMESPACE:-hivemux}"
PYTHON="${PYTHON:-python}"
TAB="$(printf '\t')"
apply() { kubectl -n "$NAMESPACE" "$@" --dry-run=client -o yaml | kubectl -n "$NAMESPACE" apply -f -; }

NODES="${EXECUTOR_NODES-$(kubectl get nodes -l hivemux.io/gpu-node=true -o jsonpath='{.items[*].metadata.name}')}"
[ -n "$NODES" ] || echo "signing-keys.sh: no GPU node (label hivemux.io/gpu-node=true or EXECUTOR_NODES): no executor key" >&2
# "<signer><TAB><file>" lines: each service's key (and cli's), then executor/<node> per node.
services="$("$PYTHON" -m hivemux.bus.signing "$DIR")"
# shellcheck disable=SC2086 # one argument per node name
nodes="$("$PYTHON" -c 'import sys, pathlib
from hivemux.bus.signing import write_keys
for name, path in write_keys(pathlib.Path(sys.argv[1]), ["executor/" + node for node in sys.argv[2:]]).items():
    print(f"{name}\t{path}")' "$DIR" $NODES)"

printf '%s\n' "$services" | while IFS="$TAB" read -r signer path; do
  case "$signer" in
    keyring | cli | executor) ;;  # the keyring last; cli stays here; the agents have per-node keys
    *) apply create secret generic "hivemux-key-$signer" --from-file=signing.key="$path" ;;
  esac
done
set --
while IFS="$TAB" read -r signer path; do
  case "$signer" in executor/*) set -- "$@" --from-file="${signer#executor/}.key=$path" ;; esac
done <<EOF
$nodes
EOF
apply create secret generic hivemux-key-executor-nodes "$@"
apply create configmap hivemux-keyring --from-file=keyring.json="$DIR/keyring.json"
