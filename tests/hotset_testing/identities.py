"""ServiceAccount tokens and the cluster's keys for tests of worker identity
(hotset_common.worker_identity), made on the real API server as the kubelet and the operator
make them: tokens from the TokenRequest API (bound to a Pod where a kubelet would bind them), the
issuer and keys from the API server's discovery endpoints, read by the operator's own code."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hotset_common import worker_identity as identity


def ensure_accounts(core: Any, namespace: str, *names: str) -> None:
    """ServiceAccounts `names` in `namespace` (kept if they exist)."""
    from kubernetes.client.exceptions import ApiException

    for name in names:
        try:
            core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
        except ApiException as exc:
            if exc.status != 409:
                raise


def mint(core: Any, namespace: str, account: str, audience: str, pod: Any = None, seconds: int = 600) -> str:
    """A token of `account` for `audience`; with `pod` (a V1Pod running as `account`), bound to it
    (its name and uid are in the token, as in a projected volume's)."""
    from kubernetes import client

    bound = (client.V1BoundObjectReference(kind="Pod", api_version="v1", name=pod.metadata.name, uid=pod.metadata.uid)
             if pod is not None else None)
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
        audiences=[audience], expiration_seconds=seconds, bound_object_ref=bound))
    return core.create_namespaced_service_account_token(account, namespace, request).status.token


def write_issuer_keys(api_client: Any, folder: Path) -> Path:
    """The keys ConfigMap's files (identity.KEYS_CONFIGMAP) in `folder`, from the API server as the
    operator reads them."""
    from hotset_operator import kube

    issuer, jwks = kube.Kube(api_client).issuer_keys()
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in identity.keys_data(issuer, jwks).items():
        (folder / name).write_text(text)
    return folder


def write_token(path: Path, token: str) -> Path:
    """Replace a token file whole, as the kubelet rotates a projected token."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(token)
    partial.replace(path)
    return path
