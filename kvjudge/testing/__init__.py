"""Test material shipped with kvjudge, for the test suite, the benchmarks and examples: runs in kvjudge's native
format (``native_runs``, with ``filler`` text and ``jsonl`` files), files written exactly as the agent harnesses
write them (``trajectories``, ``openhands``, ``harbor``, ``inspect_logs``), graded runs with an answer key
(``graded_runs``), judgments of chosen probabilities (``judgments``), a simulated judge server of known
behaviour (``sim_judge``), a real headless browser (``browser``), and the probe's check on a real GPU
(``gpu_check``, with ``gpu_memory`` and GGUF files of real geometries: ``gguf_geometry``).

Nothing in the product imports this package (tests/test_architecture.py checks it): it sits above every other
part of kvjudge and may use any of them. Nothing here is downloaded; each writer follows the harness's own
public source and documentation, field for field.
"""
