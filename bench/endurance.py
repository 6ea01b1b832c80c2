"""Endurance through a real server: many prompts over the HTTP API, mixing flow shifts, boundaries,
samplers, step counts, cache on and off, one and two experts, with interrupts and invalid prompts.

    .venv/bin/python -m bench.endurance [--prompts 40] [--interrupts 2] [--invalid 3] [--quick] [--results-dir DIR]

Checks, prints as JSON and writes to bench/results/endurance.json: every valid prompt succeeds and its
report's split equals the split its own schedule gives; invalid prompts fail with errors that name the input;
the server's RSS after warm-up (the first 6 prompts) grows by less than 5% (with --cache-classic: ComfyUI's
default cache holds past prompts' outputs until RAM runs short, which is growth by design); the first prompt,
run again at the end, is bit-identical. --prompts counts every prompt, the interrupted and invalid ones
included (unless given, those are 2 and 3, at most a quarter of --prompts each), and must leave at least one
valid prompt; fewer than 7 prompts leave a shorter warm-up, after which the RSS growth is reported but not
judged. The cache-on prompts run with the threshold criterion at bench.run's 0.24 (random_weights_plan), at which
the random stand-in experts cache.

--quick is a smoke test of the script: 4 prompts (2 valid, 1 interrupted, 1 invalid), RSS not judged,
written to endurance_quick.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import tempfile

HIGH, LOW = "wan2.2_t2v_high_noise_14B_fp16.safetensors", "wan2.2_t2v_low_noise_14B_fp16.safetensors"
WARM_UP = 6
FULL = {"prompts": 40, "interrupts": 2, "invalid": 3}
QUICK = {"prompts": 4}  # with a quarter each: 1 interrupted, 1 invalid, 2 valid
INVALID_INPUTS = ("flow_shift", "low_noise_model", "first_compute_blocks")  # what each invalid prompt's error names
HANG_GUARD_S = 1800  # each prompt takes seconds; the wait only guards against a hang


def prompt(index: int, *, sampler="uni_pc", scheduler="simple", steps=6, flow_shift=5.0, boundary="auto", ratio=0.875,
           cache=True, experts="both", seed=0, size=(64, 64, 5)) -> dict:
    from devtools.standins import TEXT_FOLDER
    from bench.common import random_weights_plan
    from bench.run import CACHE_THRESHOLD
    from devtools.paths import import_pack

    import_pack()
    from wan22_cachedit.nodes.core import cache as core_cache

    cache_inputs = random_weights_plan(core_cache, CACHE_THRESHOLD).node_inputs()

    high = HIGH if experts in ("both", "high") else "none"
    low = LOW if experts in ("both", "low") else "none"
    width, height, length = size
    schedule = {"experts": ["1", 0], "sampler": sampler, "steps": steps, "flow_shift": flow_shift, "boundary": boundary,
                "scheduler": scheduler, **({"boundary.boundary_ratio": ratio} if boundary == "custom" else {})}
    return {
        "1": {"class_type": "Wan22ExpertLoader", "inputs": {"high_noise_model": high, "low_noise_model": low,
                                                            "weight_dtype": "fp32"}},
        "2": {"class_type": "Wan22Schedule", "inputs": schedule},
        "3": {"class_type": "Wan22TextEncode", "inputs": {"model_folder": TEXT_FOLDER, "prompt": "a cat walks",
                                                          "negative_prompt": "blurry"}},
        "4": {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": width, "height": height, "length": length,
                                                                  "batch_size": 1}},
        "6": {"class_type": "Wan22CacheDiT", "inputs": {"experts": ["1", 0], **cache_inputs, "enabled": cache}},
        "5": {"class_type": "Wan22TwoStageSampler",
              "inputs": {"experts": ["6", 0], "schedule": ["2", 0], "positive": ["3", 0], "negative": ["3", 1],
                         "latent_image": ["4", 0], "seed": seed, "cfg_high": 4.0, "cfg_low": 3.0}},
        "7": {"class_type": "SaveLatent", "inputs": {"samples": ["5", 0],
                                                     "filename_prefix": f"endurance/p{index:03d}"}},
    }


def expected_split(server, p: dict) -> tuple[int, int]:
    """The split this prompt's own schedule gives, asked afresh of the server's live-split route (the same
    function as the schedule node, with no state of its own): a run that kept anything of an earlier
    prompt's schedule would disagree."""
    status, answer = server.post("/wan22/split", {"prompt": p, "nodes": ["2"]})
    assert status == 200 and "high" in answer["splits"]["2"], answer
    return answer["splits"]["2"]["high"], answer["splits"]["2"]["low"]


def invalid_prompts(start: int) -> list[tuple[dict, str]]:
    """(prompt, what its error must say): refused at queue time, or failing at run time."""
    bad_shift = prompt(start, flow_shift=-1.0)
    missing = prompt(start + 1)
    missing["1"]["inputs"]["low_noise_model"] = "wan2.2_t2v_low_noise_14B_missing.safetensors"
    too_deep = prompt(start + 2)
    too_deep["6"]["inputs"]["first_compute_blocks"] = 8
    return list(zip((bad_shift, missing, too_deep), INVALID_INPUTS))


def warm_up(total: int) -> int:
    """The prompts after which the RSS baseline is taken: WARM_UP, or fewer where that would leave none after it."""
    return min(WARM_UP, total - 1)


def count_error(total: int, interrupts: int, invalid: int) -> str | None:
    """Why these counts cannot run, naming the option; None if they can."""
    if interrupts < 0:
        return f"--interrupts {interrupts}: must be 0 or more"
    if not 0 <= invalid <= len(INVALID_INPUTS):
        return f"--invalid {invalid}: must be 0 to {len(INVALID_INPUTS)} (one prompt of each kind there is)"
    if total - interrupts - invalid < 1:
        return (f"--prompts {total} leaves no valid prompt beside --interrupts {interrupts} and --invalid {invalid}: "
                f"give at least {interrupts + invalid + 1} (the first prompt is run again at the end)")
    if warm_up(total) < 1:
        return f"--prompts {total}: give at least 2 (one to warm up, one to sample the RSS after it)"
    return None


def plan(total: int, interrupts: int, invalid: int, seed: int = 7) -> list[tuple[str, dict]]:
    rng = random.Random(seed)
    items = []
    for i in range(total - interrupts - invalid):
        boundary = rng.choice(["auto", "custom"])
        items.append(("valid", prompt(i, sampler=rng.choice(["uni_pc", "euler", "dpmpp_2m", "heun"]),
                                      scheduler=rng.choice(["simple", "beta"]), steps=rng.randint(3, 10),
                                      flow_shift=rng.choice([3.0, 5.0, 8.0, 12.0]), boundary=boundary,
                                      ratio=rng.choice([0.8, 0.9, 0.95]), cache=rng.random() < 0.6,
                                      experts=rng.choice(["both", "both", "low", "high"]), seed=rng.randint(0, 99))))
    items[0] = ("valid", prompt(0, steps=8, cache=True, seed=1234))  # the prompt run again at the end
    for k in range(interrupts):
        items.insert(WARM_UP + 3 + 5 * k, ("interrupt", prompt(1000 + k, steps=300, size=(256, 256, 9), seed=k)))
    for k, (p, _) in enumerate(invalid_prompts(2000)):
        if k < invalid:
            items.insert(WARM_UP + 1 + 7 * k, ("invalid", p))
    return items


def run_endurance(server, total=40, interrupts=2, invalid=3, log=print) -> dict:
    import psutil
    import torch
    from safetensors.torch import load_file

    problem = count_error(total, interrupts, invalid)
    if problem:
        raise ValueError(problem)
    process = psutil.Process(server.process.pid)
    items = plan(total, interrupts, invalid)
    warm = warm_up(len(items))
    expected_errors = {json.dumps(p, sort_keys=True): needle for p, needle in invalid_prompts(2000)}
    results = {"valid": 0, "valid_ok": 0, "split_mismatches": [], "failures": [], "interrupted": 0,
               "invalid": 0, "invalid_clear": 0, "rss_mb": []}
    rss_after_warm_up = None

    def latent(index: int):
        (path,) = glob.glob(os.path.join(server.base_dir, "output", "endurance", f"p{index:03d}_*.latent"))
        return load_file(path)["latent_tensor"]

    for n, (kind, p) in enumerate(items):
        if kind == "interrupt":
            _, messages = server.run_and_interrupt(p, node_id="5", at_step=3, timeout=HANG_GUARD_S)
            results["interrupted"] += any(m["type"] == "execution_interrupted" for m in messages)
        elif kind == "invalid":
            results["invalid"] += 1
            needle = expected_errors[json.dumps(p, sort_keys=True)]
            status, body = server.queue(p)
            if status == 400:
                text = json.dumps(body.get("node_errors", {}))
            else:
                entry = server.wait(body["prompt_id"], timeout=HANG_GUARD_S)
                text = json.dumps([m for m in entry["status"]["messages"] if m[0] == "execution_error"])
            results["invalid_clear"] += needle in text
        else:
            results["valid"] += 1
            status, body = server.queue(p)
            entry = (server.wait(body["prompt_id"], timeout=HANG_GUARD_S) if status == 200
                     else {"status": {"status_str": body}})
            if entry["status"]["status_str"] != "success":
                results["failures"].append((n, entry["status"]))
                continue
            results["valid_ok"] += 1
            report = entry["outputs"]["5"]["report"][0]
            got, expected = (report["split"]["high"], report["split"]["low"]), expected_split(server, p)
            if got != expected:
                results["split_mismatches"].append((n, got, expected))
        rss = process.memory_info().rss / 2**20
        results["rss_mb"].append(round(rss, 1))
        if n + 1 == warm:
            rss_after_warm_up = rss
        log(f"[endurance] {n + 1:3d}/{len(items)} {kind:9s} rss {rss:7.1f} MB")

    first = latent(0)
    again = prompt(999, steps=8, cache=True, seed=1234)
    status, body = server.queue(again)
    server.wait(body["prompt_id"], timeout=HANG_GUARD_S)
    results["first_prompt_repeats"] = bool(torch.equal(first, latent(999)))
    results["rss_growth"] = results["rss_mb"][-1] / rss_after_warm_up - 1.0
    results["warm_up"] = warm
    # After a shorter warm-up the first runs' allocations still count as growth: reported, not judged.
    results["rss_growth_judged"] = warm == WARM_UP
    results["prompts"] = len(items)
    results["ok"] = (results["valid_ok"] == results["valid"] and not results["split_mismatches"]
                     and results["interrupted"] == interrupts and results["invalid_clear"] == results["invalid"]
                     and (results["rss_growth"] < 0.05 or not results["rss_growth_judged"])
                     and results["first_prompt_repeats"])
    return results


def main() -> int:
    from bench.common import add_output_arguments, at_least

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=at_least(2),
                        help=f"every prompt, interrupted and invalid ones included (default {FULL['prompts']})")
    parser.add_argument("--interrupts", type=at_least(0),
                        help=f"default {FULL['interrupts']}, at most a quarter of --prompts")
    parser.add_argument("--invalid", type=int, choices=range(len(INVALID_INPUTS) + 1),
                        help=f"default {FULL['invalid']}, at most a quarter of --prompts")
    add_output_arguments(parser, f"a smoke test of the script: {QUICK['prompts']} prompts (1 interrupted, 1 invalid), "
                                 "RSS growth not judged")
    args = parser.parse_args()
    total = args.prompts or (QUICK if args.quick else FULL)["prompts"]
    # Unless given, the interrupts and invalid prompts are the full run's, but at most a quarter of the prompts
    # each, so that a small --prompts runs mostly valid prompts.
    counts = {"prompts": total, **{key: min(FULL[key], total // 4) if getattr(args, key) is None
                                   else getattr(args, key) for key in ("interrupts", "invalid")}}
    problem = count_error(counts["prompts"], counts["interrupts"], counts["invalid"])
    if problem:
        parser.error(problem)  # before a server starts
    from devtools.comfy_server import ComfyServer
    from devtools.standins import write_standins

    with tempfile.TemporaryDirectory(prefix="wan22-endurance-") as base:
        write_standins(os.path.join(base, "models"), os.path.join(base, "input"))
        # ComfyUI's default cache keeps past prompts' outputs until RAM runs short, by design; the classic
        # cache keeps only the current graph's, so that growth measured here would be a leak.
        with ComfyServer(base, extra_args=("--cache-classic",)) as server:
            results = run_endurance(server, counts["prompts"], counts["interrupts"], counts["invalid"])
    summary = {k: v for k, v in results.items() if k != "rss_mb"}
    summary["rss_first_last_mb"] = [results["rss_mb"][0], results["rss_mb"][-1]]
    summary["config"] = {**counts, "quick": args.quick}
    print(json.dumps(summary, indent=2, default=str))
    if not results["rss_growth_judged"]:
        print(f"[endurance] RSS growth not judged: {results['prompts']} prompts leave a warm-up of "
              f"{results['warm_up']} (the full run's is {WARM_UP})")
    os.makedirs(args.results_dir, exist_ok=True)
    path = os.path.join(args.results_dir, "endurance_quick.json" if args.quick else "endurance.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({**summary, "rss_mb": results["rss_mb"]}, f, indent=2, default=str)
    print(f"[endurance] written: {path}")
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
