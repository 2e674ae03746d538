"""``hotset-approve``: approve a ServedModel's current generation, as the identity kubectl acts as.

Where approval is required (docs/operator.md, "Approval and history"), an approver runs
``hotset-approve <model> -n <namespace>``. It asks the API server who kubectl is (``kubectl auth
whoami``: the user and groups the chart's ValidatingAdmissionPolicy compares the annotations
with), reads the model's generation, and writes the three approval annotations
(``hotset_common.labels``). The API server refuses them unless that identity may update
``servedmodels/approval``; the operator checks again, records the approval in the model's status
and serves the generation. Every other argument (``--context``, ``--as``, ``--kubeconfig``) goes to
kubectl unchanged.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from hotset_common import labels


def _kubectl(kubectl: list[str], *args: str) -> str:
    done = subprocess.run([*kubectl, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"hotset-approve: kubectl {' '.join(args[:3])} failed: {done.stderr.strip()[:500]}")
    return done.stdout


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="hotset-approve", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the ServedModel's name")
    parser.add_argument("-n", "--namespace", default="", help="its namespace (kubectl's default if omitted)")
    parser.add_argument("--generation", type=int, default=0,
                        help="the generation approved (default: the current one; pass the one you reviewed)")
    parser.add_argument("--kubectl", default=os.environ.get("HOTSET_KUBECTL", "kubectl"), help="the kubectl to run")
    args, passthrough = parser.parse_known_args(argv)
    kubectl = [args.kubectl, *passthrough, *(["--namespace", args.namespace] if args.namespace else [])]
    who = json.loads(_kubectl(kubectl, "auth", "whoami", "-o", "json"))["status"]["userInfo"]
    generation = args.generation or int(_kubectl(
        kubectl, "get", "servedmodel", args.model, "-o", "jsonpath={.metadata.generation}"))
    _kubectl(kubectl, "annotate", "servedmodel", args.model, "--overwrite",
             f"{labels.APPROVED_GENERATION}={generation}", f"{labels.APPROVED_BY_USER}={who['username']}",
             f"{labels.APPROVED_BY_GROUPS}={','.join(who.get('groups') or [])}")
    print(f"generation {generation} of {args.model} approved by {who['username']}; it is served once the operator "
          f"confirms (kubectl get servedmodel {args.model} -o jsonpath='{{.status.approval}}')")


if __name__ == "__main__":
    sys.exit(main())
