"""A tiny test-only kubelet for e2e/local: NOT product code.

It plays the kubelet's part for one or more fake GPU nodes on this machine:
registers Node objects, keeps them Ready, runs the containers of the pods bound
to them as local processes (one loopback address per pod as its pod IP), runs
their probes and reports pod status. See ``e2e/local/node_agent.py`` for the
entry point and the rules it follows (``docs/e2e.md`` has the full list).
"""
