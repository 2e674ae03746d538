"""Dedicated groups' Deployments: made, updated and removed as their ServedModel changes.

`placement: dedicated` gets Deployment ``<name>-dedicated`` pinning the model,
owned by its ServedModel (garbage-collected with it), with a spec-hash
annotation on its pod template so a changed spec rolls it. It is created
with ``replicas.min`` pods; from then on its replicas belong to the
autoscaler's field manager (``pools.py`` sizes it), and the manifest leaves
them out. Switching to ``shared`` deletes it. A Deployment of that name that
someone else owns is never applied over, scaled or deleted: the model is
refused instead (``blocked``), and checked again every ``RECHECK_S``.

Work is per changed model: a model whose Deployment already carries its spec
hash costs nothing (a restart re-applies nothing), and each model's calls
run in a task of their own, so the reconciler never waits on the network.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Mapping

from kubernetes.client.exceptions import ApiException

from hotset_common.spec import ModelSpec, Placement
from hotset_operator import index, kinds, kube, workloads
from hotset_operator.config import OperatorConfig
from hotset_operator.index import DeploymentEntry, Key, ModelEntry
from hotset_operator.writes import Writes, involved

log = logging.getLogger(__name__)
RECHECK_S = 30.0


def model_ref(entry: ModelEntry) -> dict[str, str]:
    return involved(kinds.SERVED_MODEL, kinds.API_VERSION, entry.namespace, entry.name, entry.uid)


def _body(entry: ModelEntry) -> dict[str, Any]:
    return {"metadata": {"name": entry.name, "namespace": entry.namespace, "uid": entry.uid}}


def not_ours_message(name: str) -> str:
    return (f"metadata.name: Deployment {name} exists and is not owned by this ServedModel; hotset leaves it "
            "alone: rename the model or remove that Deployment")


class DedicatedGroups:
    def __init__(self, config: OperatorConfig, kube_api: kube.Kube, writes: Writes,
                 deployments: Mapping[Any, Any], on_blocked: Callable[[Key], None]) -> None:
        self.config = config
        self.kube = kube_api
        self.writes = writes
        self.deployments = deployments  # the kopf index of managed Deployments, by (namespace, name)
        self.on_blocked = on_blocked  # the reconciler re-derives the model's status
        self.blocked: dict[Key, str] = {}
        self._running: dict[Key, asyncio.Task[None]] = {}
        self._again: dict[Key, ModelEntry] = {}

    def reconcile(self, entry: ModelEntry, accepted: bool) -> None:
        """Bring `entry`'s dedicated Deployment in line with its spec (in the background)."""
        if not accepted or entry.spec is None or entry.deleting:
            return  # a refused edit never tears down what serves; a deleted model's group goes with it
        found = self._deployment(entry)
        if entry.spec.placement is Placement.DEDICATED:
            if found is not None and found.spec_hash == workloads.group_hash(self.config, entry.spec, entry.namespace) and entry.key not in self.blocked:
                return  # it already runs this spec: a restart re-applies nothing
        elif found is None or not workloads.is_ours((list(found.owners), found.managed_by), entry.uid):
            return  # shared, and no group of its own to remove
        self._schedule(entry)

    def forget(self, key: Key) -> None:
        self.blocked.pop(key, None)

    async def recheck_blocked(self, entries: Callable[[Key], ModelEntry | None]) -> None:
        """Forever: models refused for a Deployment someone else owns, checked again (it may be gone)."""
        while True:
            await asyncio.sleep(RECHECK_S)
            for key in list(self.blocked):
                if (entry := entries(key)) is not None:
                    self._schedule(entry)

    # --- one model's calls ------------------------------------------------------------------

    def _deployment(self, entry: ModelEntry) -> DeploymentEntry | None:
        return index.one(self.deployments, (entry.namespace, workloads.dedicated_name(entry.name)))

    def _schedule(self, entry: ModelEntry) -> None:
        if entry.key in self._running:
            self._again[entry.key] = entry  # after the running one, with the newest entry
            return
        self._running[entry.key] = asyncio.create_task(self._run(entry), name=f"dedicated-{entry.name}")

    async def _run(self, entry: ModelEntry) -> None:
        key = entry.key
        try:
            while True:
                try:
                    await self._converge(entry)
                except Exception:  # an API error: tried again on the model's next change or recheck
                    log.exception("dedicated group of %s/%s", entry.namespace, entry.name)
                if (entry := self._again.pop(key, None)) is None:  # type: ignore[assignment]
                    return
        finally:
            self._running.pop(key, None)

    async def _converge(self, entry: ModelEntry) -> None:
        spec = entry.spec
        assert spec is not None
        name = workloads.dedicated_name(spec.id)
        owners = await asyncio.to_thread(self.kube.deployment_owners, entry.namespace, name)
        ours = owners is None or workloads.is_ours(owners, entry.uid)
        if spec.placement is not Placement.DEDICATED:
            if owners is not None and ours and await asyncio.to_thread(self.kube.delete_deployment, entry.namespace, name):
                self.writes.event(model_ref(entry), "Normal", "DedicatedRemoved",
                                  f"deleted Deployment {name}: placement is now {spec.placement.value}")
                await asyncio.to_thread(self._remove_inference_pool, entry, name)
            return
        if not ours:
            if self.blocked.get(entry.key) != not_ours_message(name):
                self.blocked[entry.key] = not_ours_message(name)
                self.on_blocked(entry.key)
            return
        if self.blocked.pop(entry.key, None) is not None:
            self.on_blocked(entry.key)
        if owners is None:
            await asyncio.to_thread(self._create, entry, spec, name)
            self.writes.event(model_ref(entry), "Normal", "DedicatedCreated",
                              f"created Deployment {name} with {spec.replicas.min} pod(s) pinning {spec.id}")
        else:
            before, after = await asyncio.to_thread(self._update, entry, spec, name)
            if before != after:
                self.writes.event(model_ref(entry), "Normal", "DedicatedUpdated", f"updated Deployment {name}")

    def _create(self, entry: ModelEntry, spec: ModelSpec, name: str) -> None:
        body = _body(entry)
        # Its pods run as the workers' ServiceAccount, which must exist before them in a namespace of
        # their own (the pool pass keeps it, with the namespace's other owners: pools.converge_identity).
        account = workloads.build_worker_service_account(self.config, entry.namespace,
                                                         [{**workloads.owner_reference(body), "controller": False}])
        if account is not None:
            self.kube.apply_service_account(account)
        self.kube.apply_deployment(workloads.build_dedicated_deployment(spec, body, self.config, spec.replicas.min))
        # Hand the replicas over: the autoscaler's manager takes them, this one lets go of them.
        self.kube.scale_deployment(entry.namespace, name, spec.replicas.min)
        self.kube.apply_deployment(workloads.build_dedicated_deployment(spec, body, self.config))
        self.kube.apply_disruption_budget(workloads.build_disruption_budget(name, entry.namespace, spec.id, body))
        self._apply_network_policy(entry, spec, name, body)
        self._apply_inference_pool(entry, spec, name, body)

    def _apply_inference_pool(self, entry: ModelEntry, spec: ModelSpec, name: str, body: dict[str, Any]) -> None:
        """The group's InferencePool while the chart publishes them and the model is a vllm one
        (workloads.serves_gateway); one it no longer covers is deleted. An InferencePool of that name
        that someone else owns is left alone, and a cluster without the extension's CRD gets none:
        each is a Warning on the model, and the group serves through the router either way."""
        if not workloads.serves_gateway(self.config, spec):
            self._remove_inference_pool(entry, name)
            return
        owners = self.kube.custom_owners(entry.namespace, name, kinds.INFERENCE_POOLS)
        if owners is not None and entry.uid not in owners:
            self.writes.event(model_ref(entry), "Warning", "InferencePoolNotOurs",
                              f"InferencePool {name} exists and is not owned by this ServedModel; hotset leaves it alone")
            return
        try:
            self.kube.apply_custom(workloads.build_inference_pool(self.config, spec, body), kinds.INFERENCE_POOLS)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.writes.event(model_ref(entry), "Warning", "InferencePoolUnavailable",
                              f"no InferencePool published for {name}: this cluster does not serve "
                              f"{kinds.INFERENCE_POOL_API_VERSION} (install the Gateway API Inference Extension's CRDs)")
            return
        if owners is None:
            self.writes.event(model_ref(entry), "Normal", "InferencePoolPublished",
                              f"InferencePool {name} selects the group's pods on port {self.config.worker_gateway_port}, "
                              f"endpoint picker {self.config.inference_pool_picker}:{self.config.inference_pool_picker_port}")

    def _remove_inference_pool(self, entry: ModelEntry, name: str) -> None:
        """Delete the group's InferencePool where this model owns one (blocking: on a thread)."""
        if not self.config.publishes_inference_pools:
            return  # the option is off: nothing was published (pools published before go with their models)
        owners = self.kube.custom_owners(entry.namespace, name, kinds.INFERENCE_POOLS)
        if owners is not None and entry.uid in owners and self.kube.delete_custom(entry.namespace, name,
                                                                                 kinds.INFERENCE_POOLS):
            self.writes.event(model_ref(entry), "Normal", "InferencePoolRemoved", f"deleted InferencePool {name}")

    def _apply_network_policy(self, entry: ModelEntry, spec: ModelSpec, name: str, body: dict[str, Any]) -> None:
        policy = workloads.build_network_policy(self.config, name, entry.namespace, spec.id,
                                                workloads.owner_reference(body))
        if policy is not None:
            self.kube.apply_network_policy(policy)

    def _update(self, entry: ModelEntry, spec: ModelSpec, name: str) -> tuple[str | None, str]:
        body = _body(entry)
        before = self.kube.deployment_version(entry.namespace, name)
        after = self.kube.apply_deployment(workloads.build_dedicated_deployment(spec, body, self.config))
        self.kube.apply_disruption_budget(workloads.build_disruption_budget(name, entry.namespace, spec.id, body))
        self._apply_network_policy(entry, spec, name, body)
        self._apply_inference_pool(entry, spec, name, body)
        return before, after
