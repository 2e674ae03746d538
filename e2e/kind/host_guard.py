"""The host's kernel settings (/proc/sys), read before and after the kind tier.

A kind node is a privileged container whose /proc/sys is the host's: kubelet sets
kernel.panic, kernel.panic_on_oops, vm.overcommit_memory and more at start. The
node image guards against that (e2e/kind/node/files/bin/entrypoint); this is the
check that the guard held: every setting of the host's kernel, vm, fs, user and
net (the host's own network namespace) trees is the same at the end of the
session as at its start. Counters that the kernel moves by itself are left out.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/proc/sys")
TREES = ("kernel", "vm", "fs", "user", "net")
# Values the kernel changes on its own (counters, random numbers, per-boot state).
VOLATILE = re.compile(
    r"^(kernel/random/|kernel/ns_last_pid|kernel/pty/nr|kernel/tainted|kernel/sched_domain/"
    r"|fs/(dentry-state|file-nr|inode-nr|inode-state|aio-nr|quota/|binfmt_misc/)"
    r"|vm/(stat_refresh|drop_caches|compact_memory|nr_hugepages)"
    r"|net/netfilter/nf_conntrack_count|net/ipv4/tcp_fastopen_key|net/ipv4/neigh/|net/ipv6/neigh/"
    r"|net/ipv4/conf/(?!all/|default/)|net/ipv6/conf/(?!all/|default/)|net/ipv4/route/flush|net/ipv6/route/flush"
    r"|kernel/usermodehelper/|kernel/keys/(gc_delay|persistent_keyring_expiry)$)")


@dataclass
class HostSettings:
    values: dict[str, str]

    @classmethod
    def read(cls) -> "HostSettings":
        values: dict[str, str] = {}
        for tree in TREES:
            for path in (ROOT / tree).rglob("*"):
                key = str(path.relative_to(ROOT))
                if VOLATILE.match(key) or not path.is_file():
                    continue
                with contextlib.suppress(OSError):
                    values[key] = path.read_text().strip()
        return cls(values)

    def changes(self, after: "HostSettings") -> dict[str, tuple[str, str]]:
        """{key: (before, after)} for every setting present both times whose value differs."""
        return {k: (v, after.values[k]) for k, v in self.values.items() if k in after.values and after.values[k] != v}

    def restore(self, changes: dict[str, tuple[str, str]]) -> None:
        """Write the earlier values back (best effort: some keys are read-only)."""
        for key, (before, _) in changes.items():
            with contextlib.suppress(OSError):
                (ROOT / key).write_text(before)
