"""The issue's scenarios on the local tier: chart-installed modelplane on a real control plane.

The tests are defined once, in e2e/scenarios/scenario_tests.py, for both tiers;
importing them here makes pytest collect and run them in this tier, in order.
"""
from scenarios.scenario_tests import *  # noqa: F401,F403
