"""The issue's scenarios on the kind tier: real images, real kubelets, the chart.

The tests are defined in e2e/scenarios/scenario_tests.py; importing them here
makes pytest collect and run them on this platform, in order.
"""
from scenarios.scenario_tests import *  # noqa: F401,F403
