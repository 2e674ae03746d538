"""Loaded by every Python process the node agent starts (its folder is first on PYTHONPATH).

In a real pod, binding 0.0.0.0 or 127.0.0.1 claims a port in the pod's own
network namespace. Here all pods share the host's, so such a bind would claim
the port on every pod's address at once. This rewrites those binds to the
pod's own loopback address (MODELPLANE_E2E_POD_IP), which is what "this pod"
means on this machine. Test infrastructure only.
"""
import os
import socket

_POD_IP = os.environ.get("MODELPLANE_E2E_POD_IP", "")
_ANY = {"", "0.0.0.0", "127.0.0.1", "localhost"}

if _POD_IP:
    _bind = socket.socket.bind

    def _bind_in_pod(self, address):  # type: ignore[no-untyped-def]
        if self.family == socket.AF_INET and isinstance(address, tuple) and address[0] in _ANY:
            address = (_POD_IP, *address[1:])
        return _bind(self, address)

    socket.socket.bind = _bind_in_pod  # type: ignore[method-assign]
