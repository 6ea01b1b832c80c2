"""The GPU benchmark script (bench/gpu.py), run on its tiny shape on the CPU: nothing here has a GPU, so this is
how its code is kept working until a GPU runs it at the A14B shape."""

import json
import subprocess
import sys

from devtools.paths import ROOT


def test_the_gpu_benchmark_runs_every_variant_on_its_tiny_shape_and_writes_its_table(tmp_path):
    out = tmp_path / "gpu.json"
    run = subprocess.run([sys.executable, "-m", "bench.gpu", "--shape", "tiny", "--device", "cpu", "--rounds", "1",
                          "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=1800)  # hang guard
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads(out.read_text())
    rows = results["variants"]
    assert list(rows) == ["native", "native_easycache", "ours", "ours_cachedit"]
    assert rows["ours"]["max_abs"] == 0.0  # Cache-DiT off: the native graph, bit for bit
    assert rows["native_easycache"]["rel_l2"] > 0  # EasyCache really skipped steps
    assert all(r["seconds_per_step"] > 0 and r["speedups"] for r in rows.values())
    # at its explicit threshold these random experts cache (at the node's default they cache nothing)
    assert rows["ours_cachedit"]["cached_steps"]["high"] and rows["ours_cachedit"]["block_forward_ratio"] > 1
    cached = rows["ours_cachedit"]  # the cache's memory: what it held, and what ComfyUI was asked to make room for
    assert cached["cache_asked_bytes"] > 0 and abs(cached["cache_asked_bytes"] - cached["cache_held_bytes"]) <= \
        0.1 * cached["cache_held_bytes"]
    assert results["split"] == [6, 2] and results["config"]["num_layers"] == 8
    assert f"| ours, Cache-DiT on at {results['config']['cache_threshold']:g} |" in run.stdout
