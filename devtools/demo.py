"""`make demo`: a real ComfyUI with the pack on tiny random weights, the shipped demo workflow queued
over HTTP, and the video, report and timeline written to an output folder.

Nothing can be downloaded here, so every weight is tiny and randomly initialised: the mechanics are
real (schedule, split, both experts, native VAE decode), the pictures are noise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
import urllib.request

from .comfy_server import ComfyServer
from .paths import ROOT
from .standins import write_standins
from .workflow_specs import CACHE_DEFAULTS, DEMO_TARGET

DEMO_DIR = os.environ.get("WAN22_DEMO_DIR", os.path.join(ROOT, ".demo"))
WORKFLOW = os.path.join(ROOT, "example_workflows", "api", "wan22_tiny_demo.json")
SAMPLER_NODE, VIDEO_NODE, TIMELINE_NODE, REPORT_NODE = "8", "11", "13", "14"
# What the demo server is for, in its log and on every canvas it serves (the pack's WAN22_SERVER_NOTE): its
# text encoder is a placeholder, so the other shipped workflows stop at their CLIP loader
SCOPE = ("this is the wan22-cachedit demo server, on tiny random stand-ins: only the demo workflow "
         "(example_workflows/wan22_tiny_demo.json) runs on it. The other shipped workflows stop at their text "
         "encoder (a placeholder file, so ComfyUI's CLIP loader says 'Error while deserializing header'): "
         "run them on a ComfyUI with the real Wan2.2 files.")


def progress_printer():
    def on_message(message):
        data = message.get("data", {})
        if message["type"] == "progress" and data.get("node") == SAMPLER_NODE:
            done, total = data["value"], data["max"]
            bar = "#" * int(30 * done / total)
            print(f"\r[demo] sampling [{bar:<30}] {done}/{total}", end="", flush=True)
            if done == total:
                print()
        return False
    return on_message


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep-running", action="store_true", help="leave ComfyUI running for a browser")
    args = parser.parse_args()

    with open(WORKFLOW, encoding="utf-8") as f:
        workflow = json.load(f)
    base = os.path.join(DEMO_DIR, "comfyui")
    os.makedirs(base, exist_ok=True)
    print("[demo] writing tiny random stand-ins for the workflow's files (first run only)")
    write_standins(os.path.join(base, "models"), os.path.join(base, "input"))
    out_dir = os.path.join(DEMO_DIR, "output")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)

    os.environ["WAN22_SERVER_NOTE"] = SCOPE  # the server reads it from the environment it inherits
    server = ComfyServer(base)
    print(f"[demo] starting ComfyUI 0.30.0 with the pack on {server.url} (log: {server.log_path})")
    print(f"[demo] {SCOPE}")
    started = time.monotonic()
    server.start()
    try:
        print(f"[demo] ComfyUI is up after {time.monotonic() - started:.0f} s; queueing "
              f"{os.path.relpath(WORKFLOW, ROOT)} over HTTP")
        prompt_id, messages = server.watch(workflow, progress_printer(), timeout=600)
        entry = server.wait(prompt_id, timeout=60)  # history is written just after the last message
        if entry["status"]["status_str"] != "success":
            errors = [m["data"] for m in messages if m["type"] == "execution_error"]
            print("[demo] the run failed:", json.dumps(errors or entry["status"], indent=2))
            return 1
        outputs = entry["outputs"]
        report = json.loads(outputs[REPORT_NODE]["text"][0])
        with open(os.path.join(out_dir, "report.json"), "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
        copied = {}
        for node, key in ((VIDEO_NODE, "video"), (TIMELINE_NODE, "timeline")):
            item = outputs[node]["images"][0]
            source = os.path.join(base, "output", item["subfolder"], item["filename"])
            copied[key] = os.path.join(out_dir, f"{key}{os.path.splitext(item['filename'])[1]}")
            shutil.copyfile(source, copied[key])
        split, calls, wall = report["split"], report["transformer_calls"], report["wall_seconds"]
        print(f"[demo] {report['sampler']}/{report['scheduler']}, {report['steps']} steps, shift "
              f"{report['flow_shift']:g}, boundary "
              f"{report['boundary_ratio']} ({report['boundary_source']}): {split['high']} high / {split['low']} low")
        print(f"[demo] transformer calls high/low: {calls['high']}/{calls['low']}; "
              f"wall time high/low: {wall['high']:.2f} s / {wall['low']:.2f} s")
        for role in ("high", "low"):
            stats = report["cache"].get(role, {})
            if "cached_steps" in stats:
                print(f"[demo] Cache-DiT on the {role}-noise expert: {len(stats['cached_steps'])} cached steps, "
                      f"{stats['block_forwards']} of {stats['block_forwards_without_cache']} block forwards computed")
        print(f"[demo] its Cache-DiT node asks for error_target {DEMO_TARGET:g}, a target for random stand-ins only "
              f"(at the node's default {CACHE_DEFAULTS['error_target']:g} they cache nothing); every other shipped "
              "workflow carries the node's defaults")
        with urllib.request.urlopen(server.url + "/wan22/canvas", timeout=60) as r:  # what a canvas is told
            print(f"[demo] every canvas of this server is told: {json.load(r)['server_note']}")
        print(f"[demo] output folder: {out_dir}")
        for key in ("video", "timeline"):
            print(f"[demo]   {key}: {copied[key]}")
        print(f"[demo]   report: {os.path.join(out_dir, 'report.json')}")
        print("[demo] note: every demo weight is tiny and random, so the video is noise. For real Wan2.2, put "
              "wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors and wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors "
              "in ComfyUI's models/diffusion_models, umt5_xxl_fp8_e4m3fn_scaled.safetensors in models/text_encoders, "
              "wan_2.1_vae.safetensors in models/vae, and use the native CLIP Loader (type wan) + CLIP Text Encode.")
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
