"""One measured run in a fresh process: load the named experts from single files through the pack's
loader, run a few sampler steps, print peak RSS as JSON. Used by bench.run for the memory comparison."""

import json
import sys

from bench.common import pack, text_embeddings

import torch  # noqa: E402


def rss_mb() -> float:
    """Peak RSS of this process image (VmHWM; ru_maxrss would carry the parent's peak across exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmHWM in /proc/self/status")


def main(high: str, low: str) -> None:
    pack()
    from wan22_cachedit.nodes.core import denoise, experts, schedule

    baseline = rss_mb()
    loaded = experts.load_single_file_experts(None if high == "none" else high, None if low == "none" else low, "fp32")
    plan = schedule.build_schedule(sampler="unipc", steps=4, flow_shift=12.0, has_high=loaded.has_high,
                                   has_low=loaded.has_low, model_default=0.875)
    inputs = denoise.DenoiseInputs(positive=text_embeddings(1), negative=text_embeddings(2),
                                   noise=torch.randn(1, 16, 1, 8, 8, generator=torch.Generator().manual_seed(0)))
    denoise.denoise(loaded, plan, inputs, 4.0, 3.0)
    print(json.dumps({"baseline_rss_mb": baseline, "peak_rss_mb": rss_mb()}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
