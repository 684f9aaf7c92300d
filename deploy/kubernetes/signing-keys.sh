#!/bin/sh
# The signing keys of a hivemux deployment (bus.signing), in Kubernetes: makes them once in DIR
# (kept: a rerun reuses every key there) and creates or updates one Secret per service,
# hivemux-key-<service> with its private key as `signing.key`, and the ConfigMap
# hivemux-keyring with the public keyring as `keyring.json`; the workloads mount exactly these.
# DIR/cli.key stays here: it is the operator's CLI key (HIVEMUX_SIGNING_KEY=DIR/cli.key
# HIVEMUX_KEYRING=DIR/keyring.json hivemux ...). Keep DIR as safe as the cluster's Secrets.
#   deploy/kubernetes/signing-keys.sh ./hivemux-keys        (NAMESPACE=hivemux, PYTHON=python)
set -eu
DIR="${1:?usage: signing-keys.sh DIR  (the keys are made in DIR once and kept)}"
NAMESPACE="${NAMESPACE:-hivemux}"
TAB="$(printf '\t')"
apply() { kubectl -n "$NAMESPACE" "$@" --dry-run=client -o yaml | kubectl -n "$NAMESPACE" apply -f -; }
made="$("${PYTHON:-python}" -m hivemux.bus.signing "$DIR")"  # "<signer><TAB><file>" lines
printf '%s\n' "$made" | while IFS="$TAB" read -r signer path; do
  case "$signer" in
    keyring) apply create configmap hivemux-keyring --from-file=keyring.json="$path" ;;
    cli) ;;
    *) apply create secret generic "hivemux-key-$signer" --from-file=signing.key="$path" ;;
  esac
done
