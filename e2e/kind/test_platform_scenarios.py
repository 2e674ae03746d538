"""The issue's scenarios on the kind tier: real images, real kubelets, the chart.

The tests are defined once, in e2e/scenarios/scenario_tests.py, for both tiers;
importing them here makes pytest collect and run them in this tier, in order.
"""
from scenarios.scenario_tests import *  # noqa: F401,F403
