"""Developer tools shared by the tests, the demo and the benchmarks (never imported by the pack)."""
