"""Types and names that every hotset component shares.

The worker, the router and the operator import these modules instead of
keeping their own copies, so a field or a metric name changes in one place.
"""
