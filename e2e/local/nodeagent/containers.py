"""One container as a local process: start, probe, restart with backoff, stop.

Each run starts in its own session (process group) so stopping it also stops
what it spawned (tritonserver's Python-backend stubs). The pid of the current
run is written to ``<pod dir>/<container>.pid`` and its output appended to
``<pod dir>/<container>.log``, so tests can kill a container and read its logs.
Backoff after an exit is 1 s doubling to 8 s (the kubelet's 10 s to 5 min is
too slow for tests), reset after a run that lasted 30 s.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Callable

from nodeagent import kubeapi
from nodeagent.probes import ProbeTracker, check_once

log = logging.getLogger("nodeagent.containers")

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 8.0
BACKOFF_RESET_AFTER_S = 30.0


class ContainerRunner:
    def __init__(self, spec: dict[str, Any], argv: list[str], env: dict[str, str], cwd: Path, pod_dir: Path,
                 pod_ip: str, restart_policy: str, rewrite: Callable[[str], str], start_error: str = "") -> None:
        self.spec = spec
        self.name: str = spec["name"]
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.pod_ip = pod_ip
        self.restart_policy = restart_policy
        self.rewrite = rewrite
        self.log_path = pod_dir / f"{self.name}.log"
        self.pid_path = pod_dir / f"{self.name}.pid"
        self.process: subprocess.Popen[bytes] | None = None
        self.restart_count = -1  # the first start is not a restart
        self.started_at = ""
        self.run_began = 0.0
        self.last_state: dict[str, Any] = {}
        self.waiting = ("ContainerCreating", "") if not start_error else ("CreateContainerError", start_error)
        self.start_error = start_error
        self.next_start = 0.0
        self.crashes = 0
        self.finished = False
        self.started = False
        self.ready = False
        self._probes: dict[str, ProbeTracker] = {}

    # -- lifecycle -------------------------------------------------------
    def step(self, now: float) -> None:
        if self.finished:
            return
        if self.process is None:
            if now >= self.next_start:
                self._start(now)
            return
        code = self.process.poll()
        if code is not None:
            self._exited(code, now, "Error" if code else "Completed")
            return
        self._run_probes(now)

    def _start(self, now: float) -> None:
        if self.start_error:
            self._schedule_restart(now)
            return
        self.restart_count += 1
        self.cwd.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            out.write(f"\n--- {kubeapi.now()} start #{self.restart_count}: {' '.join(self.argv)}\n".encode())
            out.flush()
            try:
                self.process = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=out,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True)
            except OSError as err:
                self.waiting = ("CreateContainerError", f"cannot start {self.argv[0]}: {err}")
                self._schedule_restart(now)
                return
        self.pid_path.write_text(str(self.process.pid))
        log.info("started %s pid %s: %s", self.name, self.process.pid, " ".join(self.argv))
        self.started_at = kubeapi.now()
        self.run_began = now
        self.waiting = ("", "")
        self._probes = {kind: ProbeTracker(self.spec[kind], started_at=now)
                        for kind in ("startupProbe", "livenessProbe", "readinessProbe") if self.spec.get(kind)}
        self.started = "startupProbe" not in self._probes
        self.ready = self.started and "readinessProbe" not in self._probes

    def _exited(self, code: int, now: float, reason: str) -> None:
        log.info("container %s exited with %s (%s)", self.name, code, reason)
        if self.process is not None:
            # A container ends with its main process: what it spawned goes too (e.g. Triton's stubs).
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.last_state = {"terminated": {"exitCode": code, "reason": reason, "startedAt": self.started_at,
                                          "finishedAt": kubeapi.now()}}
        self.process = None
        self.started = self.ready = False
        if now - self.run_began >= BACKOFF_RESET_AFTER_S:
            self.crashes = 0
        restart = self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and code != 0)
        if restart:
            self._schedule_restart(now)
        else:
            self.finished = True

    def _schedule_restart(self, now: float) -> None:
        delay = min(BACKOFF_START_S * 2 ** self.crashes, BACKOFF_MAX_S)
        self.crashes += 1
        self.next_start = now + delay
        if not self.start_error and self.waiting[0] != "CreateContainerError":
            self.waiting = ("CrashLoopBackOff", f"back-off {delay:.0f}s restarting failed container {self.name}")

    def _run_probes(self, now: float) -> None:
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            tracker = self._probes.get(kind)
            if tracker is None or not tracker.due(now):
                continue
            if kind != "startupProbe" and not self.started:
                continue
            if kind == "startupProbe" and self.started:
                continue
            tracker.record(check_once(tracker.spec, self.spec, self.pod_ip, self.env, self.rewrite), now)
            if kind == "startupProbe":
                self.started = tracker.passing
                if self.started and "readinessProbe" not in self._probes:
                    self.ready = True
            elif kind == "readinessProbe":
                self.ready = tracker.passing
            if tracker.failed and kind in ("startupProbe", "livenessProbe"):
                log.info("%s of %s failed %s times: restarting", kind, self.name, tracker.failures)
                self.stop(grace_s=5.0)
                self._exited(137, now, f"{kind} failed")
                return

    def stop(self, grace_s: float) -> None:
        """SIGTERM the process group, SIGKILL what is left after the grace period."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        # The group may outlive its leader (e.g. a stub whose parent was killed): finish it.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    # -- status ----------------------------------------------------------
    def status(self) -> dict[str, Any]:
        if self.process is not None:
            state: dict[str, Any] = {"running": {"startedAt": self.started_at}}
        elif self.finished:
            state = self.last_state
        else:
            reason, message = self.waiting
            state = {"waiting": {"reason": reason or "ContainerCreating", **({"message": message} if message else {})}}
        return {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": f"local://{self.argv[0] if self.argv else ''}",
            "containerID": f"local://{self.process.pid}" if self.process else "",
            "ready": self.ready,
            "started": self.started,
            "restartCount": max(self.restart_count, 0),
            "state": state,
            "lastState": self.last_state,
        }
