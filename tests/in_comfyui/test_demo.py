"""`make demo`'s job: a real server, the shipped demo workflow over HTTP, video + report + timeline written."""

import json
import os
import subprocess
import sys

from PIL import Image

from devtools.paths import ROOT


def test_the_demo_runs_the_shipped_workflow_and_writes_its_outputs(tmp_path):
    env = dict(os.environ, WAN22_DEMO_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-m", "devtools.demo"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=1800)  # a hang guard: the demo takes about 30 s here
    assert run.returncode == 0, run.stdout + run.stderr
    out = tmp_path / "output"
    assert f"output folder: {out}" in run.stdout and "tiny and random" in run.stdout
    assert "a target for random stand-ins only" in run.stdout  # the demo says its cache setting is not a render's
    # its scope, in its log and on every canvas it serves (the canvas shows the server's note: test_frontend)
    assert run.stdout.count("only the demo workflow (example_workflows/wan22_tiny_demo.json) runs on it") == 2
    report = json.loads((out / "report.json").read_text())
    # uni_pc/simple, 20 steps, shift 12, CFG 4 / 3: 14 / 6, each step one call with cond and uncond batched
    assert report["split"] == {"high": 14, "low": 6} and report["transformer_calls"] == {"high": 14, "low": 6}
    assert report["forward_passes"] == {"high": 28, "low": 12}
    with Image.open(out / "video.webp") as video:
        assert video.n_frames == 17 and video.size == (128, 128)
    with Image.open(out / "timeline.png") as timeline:
        assert timeline.size == (768, 300)
