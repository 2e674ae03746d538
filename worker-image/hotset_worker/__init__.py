"""The hotset worker: one pod's multi-framework model server.

Request path, one module each: api -> dataplane -> manager -> engine -> frameworks.
"""
