"""The e2e scenarios the kind tier runs (e2e/kind), written against a small Platform interface."""
