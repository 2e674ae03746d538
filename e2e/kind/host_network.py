"""What a Docker engine leaves in the host's network, and taking it away again.

dockerd creates the ``docker0`` bridge on its first start, a ``br-<id>`` bridge for
each user-defined network (kind's ``kind``) and iptables chains and rules for them,
and leaves every one of them behind when it stops. Left there, they change what the
next run meets: the first start on a machine that has never run Docker is the one
where dockerd reports no gateway for its bridge (docs/e2e.md), and a run that finds
``docker0`` already there never takes that path. So the engine the tier starts
notes the host's interfaces before it starts and, once it has stopped, deletes the
bridges and veths that appeared and the iptables rules that name them or Docker's
chains. The machine is left as the run found it, and every run on a machine the
tier left clean goes through dockerd's first start, as a new machine does.
"""
from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SYS_NET = Path("/sys/class/net")
# The interfaces dockerd makes: its default bridge, one bridge per network, a veth per container.
DOCKER_LINK = re.compile(r"^(docker0|br-[0-9a-f]{12}|veth[0-9a-f]{7})$")
DOCKER_CHAIN = re.compile(r"\bDOCKER(-[A-Z0-9-]+)?\b")


def host_links() -> set[str]:
    return {path.name for path in SYS_NET.iterdir()} if SYS_NET.is_dir() else set()


def default_bridge_exists() -> bool:
    return (SYS_NET / "docker0").exists()


@dataclass
class HostNetwork:
    """The host's interfaces and iptables rules before an engine of ours started (kept in a file, so
    `engine.py stop`, or the next start after an interrupted run, can clean up)."""

    links_before: set[str]
    rules_before: set[str]

    @classmethod
    def read(cls) -> "HostNetwork":
        return cls(host_links(), set(iptables_save().splitlines()))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"links": sorted(self.links_before), "rules": sorted(self.rules_before)}))

    @classmethod
    def load(cls, path: Path) -> "HostNetwork | None":
        try:
            saved = json.loads(path.read_text())
            return cls(set(saved["links"]), set(saved["rules"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def engine_links(self) -> set[str]:
        """The Docker interfaces that appeared since, whose names dockerd uses."""
        return {link for link in host_links() - self.links_before if DOCKER_LINK.match(link)}

    def remove_leftovers(self) -> list[str]:
        """Delete the engine's interfaces and its iptables rules; returns what could not be removed."""
        links = self.engine_links()
        remove_iptables_rules(links, self.rules_before)
        left = []
        for link in sorted(links, key=lambda name: not name.startswith("veth")):
            done = subprocess.run(["ip", "link", "delete", link], capture_output=True, text=True, timeout=30)
            if done.returncode != 0 and (SYS_NET / link).exists():
                left.append(f"{link}: {done.stderr.strip()}")
        return left


def without_docker_rules(saved: str, links: set[str], rules_before: set[str]) -> str:
    """iptables-save output less the lines added since `rules_before` that declare or jump to Docker's
    chains or name one of `links` (what was there before the engine started stays)."""
    names = re.compile(r"(^|\s)!?\s*-[io]\s+(" + "|".join(map(re.escape, sorted(links))) + r")(\s|$)") if links else None
    kept = []
    for line in saved.splitlines():
        ours = DOCKER_CHAIN.search(line) or (names is not None and names.search(line))
        if ours and line not in rules_before:
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def iptables_save() -> str:
    save = shutil.which("iptables-save")
    if save is None:
        return ""
    try:
        return subprocess.run([save], capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return ""


def remove_iptables_rules(links: set[str], rules_before: set[str]) -> None:
    """Rewrite the tables without the engine's rules (iptables-restore replaces each table in one step)."""
    restore = shutil.which("iptables-restore")
    saved = iptables_save()
    if restore is None or not saved:
        return
    cleaned = without_docker_rules(saved, links, rules_before)
    if cleaned.strip() != saved.strip():
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run([restore], input=cleaned, capture_output=True, text=True, timeout=30, check=True)
