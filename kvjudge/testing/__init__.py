"""Test material shipped with kvjudge: files written exactly as the agent harnesses write them, and simulated
servers of known behaviour, for the test suite, the benchmarks and examples.

Nothing in the product imports this package (tests/test_architecture.py checks it): it sits above every other
part of kvjudge and may use any of them. Nothing here is downloaded; each writer follows the harness's own
public source and documentation, field for field.
"""
