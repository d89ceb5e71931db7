"""Locust load tests for the served pipelines, with an exact-P99 gate.

Run through ``tools loadtest``, or directly: ``locust -f loadtests/locustfile.py --help``.
"""
