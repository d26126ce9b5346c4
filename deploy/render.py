#!/usr/bin/env python3
"""Print the chart's manifests as `helm template` would, with Helm's own engine and no helm binary.

    python deploy/render.py --set "apiKeys.keys={KEY}" [-f my-values.yaml] [--release orchard] | kubectl apply -f -

Uses the PyPI package helm-python-sdk (the Helm Go SDK behind a C ABI; `pip install .[deploy]`). Applying the
output with kubectl gives the same objects as `helm install`, without Helm's release tracking (upgrade with the
same command; uninstall with `kubectl delete -f`).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

CHART = Path(__file__).resolve().parent / "helm" / "orchard"
# Helm's install order, so `kubectl apply` meets each namespace before what lives in it.
ORDER = ["Namespace", "NetworkPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret", "ConfigMap",
         "PersistentVolumeClaim", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Service",
         "Deployment", "StatefulSet", "Ingress"]


def merge(base: dict, extra: dict) -> dict:
    """Deep merge, extra wins (Helm's order for -f and --set)."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def values_of(args: argparse.Namespace, helm) -> dict:
    values: dict = {}
    for path in args.values:
        values = merge(values, helm.values_from_yaml(Path(path).read_text()))
    for assignment in args.set:
        values = merge(values, helm.parse_set_string(assignment))
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-f", "--values", action="append", default=[], help="a values file (repeatable)")
    parser.add_argument("--set", action="append", default=[], help="NAME=VALUE as helm --set (repeatable)")
    parser.add_argument("--release", default="orchard", help="release name (default orchard)")
    parser.add_argument("--namespace", default="default", help="release namespace (default default)")
    args = parser.parse_args(argv)
    import helm_python as helm

    try:
        with helm.Chart.load(str(CHART)) as chart:
            values = values_of(args, helm)
            redis = chart.merge_values(values)["redis"]
            if redis["enabled"] and not (redis["password"] or redis["existingSecret"]):
                print("render.py cannot look up the password already in the cluster, so every run would make a new "
                      "one: give redis.password or redis.existingSecret", file=sys.stderr)
                return 1
            files = chart.render(values, name=args.release, namespace=args.namespace, is_install=True)
    except helm.HelmError as e:
        print(f"render failed: {e}", file=sys.stderr)
        return 1
    for path, doc in documents(files):
        print(f"---\n# Source: {path}\n{doc}")
    return 0


def documents(files: dict[str, str]) -> list[tuple[str, str]]:
    """(template path, one YAML document) in Helm's install order."""
    docs = [(path, doc.strip()) for path, text in sorted(files.items()) if path.endswith(".yaml")
            for doc in re.split(r"^---\s*$", text, flags=re.MULTILINE) if _kind(doc)]
    return sorted(docs, key=lambda item: ORDER.index(_kind(item[1])) if _kind(item[1]) in ORDER else len(ORDER))


def _kind(doc: str) -> str:
    found = re.search(r"^kind:\s*(\S+)", doc, flags=re.MULTILINE)
    return found.group(1) if found else ""


if __name__ == "__main__":
    sys.exit(main())
