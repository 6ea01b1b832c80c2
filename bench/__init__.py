"""Benchmarks (`make bench`) and the endurance run: numbers measured side by side, never claimed."""
