"""`make demo`: a real ComfyUI with the pack on tiny random experts, one prompt queued over HTTP.

The experts are tiny and randomly initialised (nothing can be downloaded here): the numbers the demo
prints are real (the split comes from the real schedule), the weights are not a real model.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from . import tiny_wan
from .comfy_server import ComfyServer
from .paths import ROOT

DEMO_DIR = os.path.join(ROOT, ".demo")
HIGH = "wan2.2_t2v_high_noise_14B_fp16.safetensors"
LOW = "wan2.2_t2v_low_noise_14B_fp16.safetensors"

# The default schedule of the pack's schedule node, on both experts, as an API-format prompt.
DEMO_PROMPT = {
    "1": {"class_type": "Wan22ExpertLoader",
          "inputs": {"high_noise_model": HIGH, "low_noise_model": LOW, "weight_dtype": "default"}},
    "2": {"class_type": "Wan22Schedule",
          "inputs": {"experts": ["1", 0], "sampler": "unipc", "steps": 40, "flow_shift": 12.0, "boundary": "auto",
                     "boundary_ratio": 0.875}},
    "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 1]}},
}


def write_demo_models(models_dir: str) -> None:
    folder = os.path.join(models_dir, "diffusion_models")
    if all(os.path.isfile(os.path.join(folder, n)) for n in (HIGH, LOW)):
        return
    print("[demo] writing tiny random Wan2.2 T2V experts (fp16) into", folder)
    tiny_wan.write_tiny_models(models_dir, formats=("fp16",), tasks=("t2v",), diffusers_folders=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep-running", action="store_true", help="leave ComfyUI running for a browser")
    args = parser.parse_args()

    base = os.path.join(DEMO_DIR, "comfyui")
    os.makedirs(base, exist_ok=True)
    write_demo_models(os.path.join(base, "models"))
    out_dir = os.path.join(DEMO_DIR, "output")
    os.makedirs(out_dir, exist_ok=True)

    server = ComfyServer(base)
    print(f"[demo] starting ComfyUI 0.30.0 with the pack on {server.url} (log: {server.log_path})")
    started = time.monotonic()
    server.start()
    try:
        print(f"[demo] ComfyUI is up after {time.monotonic() - started:.0f} s; queueing the demo prompt over HTTP")
        status, body = server.queue(DEMO_PROMPT)
        if status != 200:
            print("[demo] the prompt was refused:", json.dumps(body, indent=2))
            return 1
        entry = server.wait(body["prompt_id"], timeout=300)
        if entry["status"]["status_str"] != "success":
            print("[demo] the prompt failed:", json.dumps(entry["status"], indent=2))
            return 1
        split = entry["outputs"]["2"]["split"][0]
        summary = entry["outputs"]["2"]["text"][0]
        report = {"prompt": DEMO_PROMPT, "split": split, "summary": summary,
                  "experts": entry["outputs"]["1"]["text"][0]}
        report_path = os.path.join(out_dir, "schedule_report.json")
        with open(report_path, "w") as f:
            json.dump(report, f, indent=2)
        print(f"[demo] {report['experts']}")
        print(f"[demo] default schedule: {summary}")
        print(f"[demo] high-noise expert: {split['high']} steps, low-noise expert: {split['low']} steps")
        print(f"[demo] report written to {report_path}")
        print("[demo] note: the demo experts are tiny and random. For real Wan2.2 files, put "
              "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors and wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors "
              "in ComfyUI's models/diffusion_models and pick them on 'Load Wan2.2 Experts'.")
        if args.keep_running:
            print(f"[demo] ComfyUI keeps running on {server.url}; Ctrl-C stops it")
            while True:
                time.sleep(3600)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
