"""Benchmarks: each prints ratios measured side by side in one run and writes bench/results/<name>.json."""
