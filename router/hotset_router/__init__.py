"""The hotset router: one gateway in front of many worker pods.

The request path reads from the module names: ``api`` -> ``routing`` ->
``placement`` -> ``model_map``. ``discovery`` finds the pods, ``status_sync``
keeps the map fresh from the workers' own reports, ``replication`` adds and
removes copies of hot models.
"""
