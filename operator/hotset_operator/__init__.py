"""The hotset operator: turns ServedModels into worker pods and keeps their status honest."""
