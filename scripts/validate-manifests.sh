#!/usr/bin/env bash
# Checks docs/deploy/'s Kubernetes objects against the API's published schemas, strictly
# (an unknown field is an error), with kubernetes-validate from PyPI in a virtualenv under
# target/. The kubelet's own configuration has no schema there; docs.rs checks its fields.
#
#   scripts/validate-manifests.sh [FILE.yaml...]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
case "${1:-}" in
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
venv=target/k8s-validate
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check kubernetes-validate >&2
fi
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(docs/deploy/partition-pod.yaml docs/deploy/kvm-device-plugin.yaml)
"$venv/bin/kubernetes-validate" --strict --quiet "${files[@]}"
say "kubernetes-validate: ${files[*]} valid"
