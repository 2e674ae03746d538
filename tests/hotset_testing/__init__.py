"""Helpers shared by the test suites: real servers started on loopback, stopped by pid."""
