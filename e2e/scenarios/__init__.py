"""The e2e scenarios both tiers run (e2e/local and e2e/kind), written against a small Platform interface."""
