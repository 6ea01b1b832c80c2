"""Quality on the trained test beds: what each cache costs in error, against the blocks it saves and the time.

Every point runs the official template's graph of ComfyUI's own nodes on a bed's two trained experts
(devtools/testbed/: several beds, each built once per machine and cached; `tuning` is the only one any default
is chosen on; a bed's role says whether it has tuned anything): per expert MODEL -> [cache node] ->
ModelSamplingSD3 -> KSamplerAdvanced (high: 0 -> switch with its leftover noise, low: switch -> end), with a
class's prompt and the negative. Per bed
and step count (20 and 40 on every bed, and the few-step LoRA runs 4, 6, 8 on the tuning bed), for each of CASES
(a seed and a class):

- native: the graph without a cache node (the reference of that seed);
- ours: Wan2.2 Cache-DiT (MODEL) on each expert, with the error criterion over error targets (alone, with
  cache-dit's TaylorSeer calibrator, and with its DMD and FoCa calibrators over fewer targets), and with the
  threshold criterion over thresholds (the rest of its inputs at the node's defaults); the node's defaults;
- ComfyUI's EasyCache and LazyCache (their other inputs at their defaults), over their thresholds;
- Spectrum (ComfyUI-Spectrum-WAN-Proper, unmodified, from $WAN22_THIRD_PARTY; bench/peers.py), at its
  defaults, over its window and warm-up, and with its bias_shift transition: skipped, saying why, where it is
  not there;
- error budgets 0.03 and 0.05: the Wan2.2 Cache-DiT Error Budget node's calibration on CALIBRATION (another seed
  and class) with its default calibration_size (a smaller latent, confirmed once at full size; on a bed trained
  at several sizes, its smallest), then the pack's sampler with the calibrated plan on each case; what the
  calibration cost, in full-size uncached runs of transformer work; and a budget below any cached step's change,
  which must be refused naming error_budget.

On the tuning bed it also measures the single-step table (each step cached alone, DBCache's reuse, against the
cache's miss the error criterion measures there and the sampler's stride), which the criterion's one unmeasured
factor, its propagation, is chosen on, and whether each peer keeps state between queued runs on ComfyUI's cached
MODEL. For every point of the error criterion it keeps the nodes' own estimate of the error beside the measured
one (the band check: measured within BAND x the target and x the estimate, for targets 0.01 to 0.05).

Error: relative L2 (and PSNR) of the final latent against the native run of the same seed and class, the
median over the cases and their spread (min, max). Block cost: the transformer blocks run, counted by forward
hooks on the blocks, as a share of native's. Speed-up: each point's time against the mean of the native runs
just before and after it in the same case (the machine is shared: only neighbouring runs compare), the median
over the cases. Torch runs on one thread.

It then checks, per bed, what the README states: the Cache-DiT node's defaults at 20 and 40 steps (median error
at most 0.03, block cost at most 0.85), the budgets (median error within the budget, block cost falling as it
grows, the refusal, the calibration's work at most 3 full runs), and a point of ours at no more error and no
more block cost than each peer point that skips something at a median error of 0.1 or less. `choose` derives
the pack's error-criterion constants and default target from the tuning bed's results alone (a test holds the
pack to them).

Writes bench/results/quality_<bed>.{json,md,png} and quality.md (the beds side by side, every check);
--quick is a smoke test on a quick bed (a few points, 20 steps; quality_quick.*, its figures claim nothing).

    .venv/bin/python -m bench.quality [--bed tuning deep wide] [--steps 20 40 ...] [--jobs 2] [--quick]
    .venv/bin/python -m bench.quality --choose     # the constants the tuning bed's results choose
    .venv/bin/python -m bench.quality --budgets    # the budgets' points again, into the kept results (minutes)

Its rooms: settings.py (what is swept, the bounds), measure.py (the runs), judge.py (the checks and the choice:
pure, tested on small result dictionaries), report.py (tables, chart, files), __main__.py (the command line,
the parts in child processes).
"""

from bench.quality.judge import band_checks, checks, choose, in_band, pack_constants
from bench.quality.settings import RUNS

__all__ = ["RUNS", "band_checks", "checks", "choose", "in_band", "pack_constants"]
