"""The two-stage loop against diffusers' own WanPipeline, on tiny experts (no ComfyUI)."""

import pytest
import torch
from diffusers import WanPipeline

from devtools import tiny_wan
from wan22_cachedit.nodes.core import denoise as D
from wan22_cachedit.nodes.core import schedule as S
from wan22_cachedit.nodes.core.errors import Wan22InputError
from .handles import handle

SHAPE = (1, 16, 2, 16, 16)  # [B, C, F, H, W] in latent space: 2 frames of 16x16 -> 128 tokens


@pytest.fixture(scope="module")
def pair():
    return tiny_wan.make_expert("t2v", 11), tiny_wan.make_expert("t2v", 12)


def run_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return D.DenoiseInputs(positive=torch.randn(1, 24, 4096, generator=g),
                           negative=torch.randn(1, 24, 4096, generator=g),
                           noise=torch.randn(SHAPE, generator=g))


def reference(high, low, sampler, shift, steps, boundary, cfg_high, cfg_low, inputs):
    scheduler = S.SAMPLERS[sampler](shift)
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=scheduler, transformer=high,
                       transformer_2=low, boundary_ratio=boundary)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt_embeds=inputs.positive, negative_prompt_embeds=inputs.negative, latents=inputs.noise.clone(),
               num_inference_steps=steps, guidance_scale=cfg_high, guidance_scale_2=cfg_low, output_type="latent",
               height=SHAPE[3] * 8, width=SHAPE[4] * 8, num_frames=(SHAPE[2] - 1) * 4 + 1)
    return out.frames


@pytest.mark.parametrize("sampler", ["unipc", "euler"])
@pytest.mark.parametrize("shift", [5.0, 12.0])
@pytest.mark.parametrize("cfg_high,cfg_low", [(4.0, 3.0), (3.5, 1.0)])
def test_the_loop_equals_diffusers_wan_pipeline(pair, sampler, shift, cfg_high, cfg_low):
    high, low = pair
    steps = 12
    schedule = S.build_schedule(sampler=sampler, steps=steps, flow_shift=shift, has_high=True, has_low=True,
                                model_default=0.875)
    assert 0 < schedule.high_steps < steps  # both experts really run
    inputs = run_inputs()
    ours, record = D.denoise(handle(high, low), schedule, inputs, cfg_high, cfg_low)
    ref = reference(high, low, sampler, shift, steps, 0.875, cfg_high, cfg_low, inputs)
    assert (ours - ref).abs().max().item() <= 1e-5
    assert record.split == schedule.split
    assert [s.expert for s in record.steps] == ["high"] * schedule.high_steps + ["low"] * schedule.low_steps
    expected_low_forwards = schedule.low_steps * (1 if cfg_low == 1.0 else 2)
    assert record.forwards() == {"high": 2 * schedule.high_steps, "low": expected_low_forwards}


def test_low_noise_only_with_euler_runs_where_diffusers_crashes(pair):
    _, low = pair
    inputs = run_inputs(3)
    with pytest.raises(Exception):  # diffusers routes Euler's t=1000 to the missing high-noise expert
        reference(None, low, "euler", 5.0, 8, 1.0, 3.0, 3.0, inputs)
    schedule = S.build_schedule(sampler="euler", steps=8, flow_shift=5.0, has_high=False, has_low=True,
                                model_default=0.875)
    ours, record = D.denoise(handle(None, low), schedule, inputs, 4.0, 3.0)
    assert record.split == (0, 8) and {s.expert for s in record.steps} == {"low"}
    # The same run as a single-transformer pipeline (Wan2.1 mode) with the low-noise expert.
    single = reference(low, None, "euler", 5.0, 8, None, 3.0, None, inputs)
    assert (ours - single).abs().max().item() <= 1e-5


def test_high_noise_only_runs_every_step_on_the_high_noise_expert(pair):
    high, _ = pair
    schedule = S.build_schedule(sampler="unipc", steps=6, flow_shift=12.0, has_high=True, has_low=False,
                                model_default=0.875)
    ours, record = D.denoise(handle(high, None), schedule, run_inputs(), 4.0, 3.0)
    assert [s.expert for s in record.steps] == ["high"] * 6
    single = reference(high, None, "unipc", 12.0, 6, None, 4.0, None, run_inputs())
    assert (ours - single).abs().max().item() <= 1e-5


def test_same_inputs_twice_give_bit_identical_latents(pair):
    schedule = S.build_schedule(sampler="unipc", steps=8, flow_shift=5.0, has_high=True, has_low=True,
                                model_default=0.875)
    a, _ = D.denoise(handle(*pair), schedule, run_inputs(1), 4.0, 3.0)
    b, _ = D.denoise(handle(*pair), schedule, run_inputs(1), 4.0, 3.0)
    assert torch.equal(a, b)


class RecordingPlacement:
    """Records which expert is on the compute device, the way the ComfyUI glue moves them."""

    def __init__(self):
        self.device = torch.device("cpu")
        self.on_device = set()
        self.moves = []
        self.most_at_once = 0

    def activate(self, role, module):
        if role in self.on_device:
            return
        for other in list(self.on_device):
            self.on_device.discard(other)
            self.moves.append((other, "offload"))
        self.on_device.add(role)
        self.moves.append((role, "compute"))
        self.most_at_once = max(self.most_at_once, len(self.on_device))

    def release(self):
        for role in list(self.on_device):
            self.on_device.discard(role)
            self.moves.append((role, "offload"))


def test_placement_sees_one_expert_at_a_time_and_is_released_after_an_interrupt(pair):
    schedule = S.build_schedule(sampler="unipc", steps=10, flow_shift=12.0, has_high=True, has_low=True,
                                model_default=0.875)
    placement = RecordingPlacement()
    D.denoise(handle(*pair), schedule, run_inputs(), 4.0, 3.0, placement=placement)
    assert placement.moves == [("high", "compute"), ("high", "offload"), ("low", "compute"), ("low", "offload")]
    assert placement.most_at_once == 1

    class Interrupted(BaseException):
        pass

    def stop_at_3(i, n):
        if i == 3:
            raise Interrupted()

    placement = RecordingPlacement()
    with pytest.raises(Interrupted):
        D.denoise(handle(*pair), schedule, run_inputs(), 4.0, 3.0, placement=placement, before_step=stop_at_3)
    assert placement.on_device == set() and placement.moves[-1] == ("high", "offload")


def test_a_schedule_built_for_other_experts_is_refused(pair):
    schedule = S.build_schedule(sampler="unipc", steps=4, flow_shift=5.0, has_high=False, has_low=True,
                                model_default=0.875)
    with pytest.raises(Wan22InputError, match="schedule: this schedule was built for other experts"):
        D.denoise(handle(*pair), schedule, run_inputs(), 4.0, 3.0)


@pytest.mark.parametrize("sampler", ["unipc", "dpmpp"])
def test_a_long_schedule_with_repeated_timesteps_runs_every_step(pair, sampler):
    schedule = S.build_schedule(sampler=sampler, steps=120, flow_shift=12.0, has_high=True, has_low=True,
                                model_default=0.875)
    assert len(set(schedule.timesteps)) < len(schedule.timesteps)  # 999 appears twice
    g = torch.Generator().manual_seed(0)
    inputs = D.DenoiseInputs(positive=torch.randn(1, 8, 4096, generator=g), negative=torch.randn(1, 8, 4096, generator=g),
                             noise=torch.randn(1, 16, 1, 4, 4, generator=g))
    out, record = D.denoise(handle(*pair), schedule, inputs, 4.0, 1.0)
    assert len(record.steps) == 120 and torch.isfinite(out).all()
