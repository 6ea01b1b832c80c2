"""What bench.quality measures: the runs, the cases, the points swept, the bounds its checks hold, the labels."""

from __future__ import annotations

LORA_RUN = {"sampler": "euler", "scheduler": "simple", "flow_shift": 5.0, "cfg": {"high": 1.0, "low": 1.0}}
RUNS = {4: LORA_RUN, 6: LORA_RUN, 8: LORA_RUN,
        20: {"sampler": "uni_pc", "scheduler": "simple", "flow_shift": 8.0, "cfg": {"high": 4.0, "low": 3.0}},
        40: {"sampler": "euler", "scheduler": "simple", "flow_shift": 5.0, "cfg": {"high": 4.0, "low": 3.0}}}
MAIN_STEPS, FEW_STEPS = (20, 40), (4, 6, 8)
CASES = [(101, 1), (202, 4), (303, 6)]  # (seed, class) of each measured run
CALIBRATION = (11, 0)  # the budget node's calibration run: another seed and class
TARGETS = [0.01, 0.0125, 0.015, 0.0175, 0.02, 0.0225, 0.025, 0.0275, 0.03, 0.04, 0.05, 0.07, 0.1]
TAYLORSEER = [0.015, 0.02, 0.03, 0.05]  # the error criterion with cache-dit's TaylorSeer calibrator
FORECASTS = {"dmd": [0.02, 0.03, 0.05], "foca": [0.02, 0.03, 0.05]}  # ... with its other calibrators (reported)
THRESHOLDS = [0.03, 0.05, 0.08, 0.12, 0.16, 0.24]
COMFY = [0.02, 0.05, 0.1, 0.2, 0.3]
SPECTRUM = {"defaults": {}, "window 1.5": {"window_size": 1.5}, "window 3": {"window_size": 3.0},
            "window 4": {"window_size": 4.0}, "warm-up 3": {"warmup_steps": 3}, "warm-up 8": {"warmup_steps": 8},
            "bias_shift": {"transition_mode": "bias_shift"}}
BUDGETS = [0.03, 0.05]
REFUSED_BUDGET = 0.0005  # below any cached step's change on the beds: must be refused naming error_budget
QUICK_REFUSED_BUDGET = 1e-6  # ... on the quick bed, whose barely trained experts cache a step for less
MAX_BUDGET_WORK = 3.0  # full-size uncached runs a budget's calibration may cost
DEFAULTS_BOUND = {"rel_l2": 0.03, "block_cost": 0.85}
CHOICE_MARGIN = 2 / 3  # the default target is chosen to keep the tuning bed at 2/3 of the error bound
BAND = (0.67, 1.5)  # a target means its number: the measured median error within this share of it and of the estimate
BAND_TARGETS = (0.01, 0.05)  # the targets the band is checked at
# The frontier: where published 14B results sit (about 2.5x on the transformer): at a median error of FRONTIER_ERROR
# or less, at most this share of the blocks run, per step count
FRONTIER_ERROR, FRONTIER = 0.03, {20: 0.55, 40: 0.40}
NATIVE_EVERY = 6
LABELS = {"ours_error": "Cache-DiT, error criterion (target swept)",
          "ours_taylorseer": "Cache-DiT, error criterion + TaylorSeer (target swept)",
          "ours_dmd": "Cache-DiT, error criterion + DMD (target swept)",
          "ours_foca": "Cache-DiT, error criterion + FoCa (target swept)",
          "ours_threshold": "Cache-DiT, threshold criterion (threshold swept)",
          "defaults": "Cache-DiT node defaults", "easycache": "ComfyUI EasyCache", "lazycache": "ComfyUI LazyCache",
          "spectrum": "Spectrum-WAN", "budget": "Cache-DiT Error Budget (calibrated elsewhere)"}
COLOURS = {"ours_error": "#d62728", "ours_taylorseer": "#e377c2", "ours_dmd": "#bcbd22", "ours_foca": "#17becf",
           "ours_threshold": "#8c564b", "defaults": "#ff7f0e",
           "easycache": "#2ca02c", "lazycache": "#1f77b4", "spectrum": "#9467bd", "budget": "#000000"}
OURS = ("ours_error", "ours_taylorseer", "ours_dmd", "ours_foca", "ours_threshold", "defaults", "budget")
PEERS = ("easycache", "lazycache", "spectrum")  # the other caches' points, judged against ours
ESTIMATED = ("ours_error", "ours_taylorseer", "ours_dmd", "ours_foca", "defaults")  # points with the nodes' estimate
FLOOR = 1e-5
