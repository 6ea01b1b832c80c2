"""The boundary, its precedence and the split counted from a run's sigmas (no ComfyUI: the sigmas are
given here; ComfyUI's own are checked in tests/in_comfyui)."""

import copy
import inspect
import math

import pytest

from wan22_cachedit.nodes.core import schedule as S
from wan22_cachedit.nodes.core.errors import Wan22InputError

# euler/simple at 4 steps, shift 5: ComfyUI's template's (and LightX2V's) sigmas.
LIGHTX2V = (1.0, 0.9375, 0.8333, 0.625, 0.0)


def schedule_of(sigmas, has_high=True, has_low=True, default=0.875, custom=None, sampler="euler"):
    return S.build_schedule(sampler=sampler, scheduler="simple", steps=len(sigmas) - 1, flow_shift=5.0,
                            sigmas=sigmas, has_high=has_high, has_low=has_low, model_default=default,
                            custom_ratio=custom)


def test_a_step_is_high_noise_while_its_sigma_is_at_or_above_the_boundary():
    assert schedule_of(LIGHTX2V).split == (2, 2)  # 0.9375 >= 0.875 > 0.8333
    assert schedule_of(LIGHTX2V, custom=0.9375).split == (2, 2)  # "at" the boundary counts as high
    assert schedule_of(LIGHTX2V, custom=0.94).split == (1, 3)
    assert schedule_of(LIGHTX2V, custom=0.8).split == (3, 1)


def test_a_boundary_of_one_or_zero_gives_a_split_with_an_empty_side():
    assert schedule_of(LIGHTX2V, custom=1.0).split == (1, 3)  # sigma 1.0 is at the boundary
    assert schedule_of((0.99, 0.5, 0.0), custom=1.0).split == (0, 2)  # a run that starts below 1.0
    assert schedule_of(LIGHTX2V, custom=0.0).split == (4, 0)
    assert schedule_of((1.0, 0.0)).split == (1, 0)  # one step starts at sigma 1.0


@pytest.mark.parametrize("custom", [None, 0.0, 1.0, 0.5])
def test_one_expert_alone_pins_every_step_whatever_the_boundary(custom):
    low = schedule_of(LIGHTX2V, has_high=False, custom=custom)
    assert low.split == (0, 4) and low.boundary == S.Boundary(None, "low_noise_only")
    assert not any(low.boundary.routes_high(s) for s in LIGHTX2V)  # sigma 1.0 never asks for the missing expert
    high = schedule_of(LIGHTX2V, has_low=False, custom=custom)
    assert high.split == (4, 0) and high.boundary.source == "high_noise_only"


def test_boundary_precedence_pinned_then_custom_then_model_default():
    r = S.resolve_boundary
    assert r(has_high=True, has_low=True, model_default=0.9) == S.Boundary(0.9, "model_default")
    assert r(has_high=True, has_low=True, model_default=0.9, custom_ratio=0.8) == S.Boundary(0.8, "custom")
    assert r(has_high=False, has_low=True, model_default=0.9, custom_ratio=0.8) == S.Boundary(None, "low_noise_only")
    assert r(has_high=True, has_low=False, model_default=0.9, custom_ratio=0.8) == S.Boundary(None, "high_noise_only")
    with pytest.raises(Wan22InputError, match="load at least one"):
        r(has_high=False, has_low=False, model_default=0.9)


def test_each_stage_steps_through_its_side_of_the_switch_as_split_sigmas_cuts_it():
    schedule = schedule_of(LIGHTX2V)
    assert schedule.stage_sigmas("high") == (1.0, 0.9375, 0.8333)
    assert schedule.stage_sigmas("low") == (0.8333, 0.625, 0.0)
    all_low = schedule_of(LIGHTX2V, has_high=False)
    assert all_low.stage_sigmas("high") == (1.0,) and all_low.stage_sigmas("low") == LIGHTX2V


def schedule_module_state() -> dict:
    """Copies of what a build could leave behind in the schedule module: its data globals (a cache, a registry)
    and its functions' default values (a default list a call appends to)."""
    state = {}
    for name, value in vars(S).items():
        if name.startswith("__"):
            continue
        if inspect.isfunction(value) and value.__module__ == S.__name__:
            state[name] = (value.__defaults__, value.__kwdefaults__)
        elif isinstance(value, (dict, list, set, tuple, str, int, float, type(None))):
            state[name] = value
    return copy.deepcopy(state)


def test_a_schedule_is_built_from_its_own_inputs_alone_and_leaves_nothing_behind():
    """Successive builds, with other boundaries, experts and sigmas, each give what a build on its own gives
    (here: the same builds in the reverse order); the module's globals and defaults are as before, and a
    caller reusing its sigmas list afterwards changes no schedule built from it."""
    cases = [dict(custom=0.95), dict(), dict(custom=0.8), dict(has_high=False), dict(default=0.95), dict()]
    before = schedule_module_state()
    given = [list(LIGHTX2V) for _ in cases]
    built = [schedule_of(sigmas, **case) for sigmas, case in zip(given, cases)]
    for sigmas in given:
        sigmas[1:3] = [0.5, 0.4]
    assert [s.split for s in built] == [(1, 3), (2, 2), (3, 1), (0, 4), (1, 3), (2, 2)]
    assert all(s.sigmas == LIGHTX2V for s in built)
    assert built == [schedule_of(LIGHTX2V, **case) for case in reversed(cases)][::-1]
    assert schedule_module_state() == before


@pytest.mark.parametrize("old,new", [("unipc", "uni_pc"), ("euler", "euler"), ("dpmpp", "dpmpp_2m")])
def test_old_sampler_names_map_onto_comfyuis_samplers(old, new):
    comfy_samplers = ("euler", "dpmpp_2m", "uni_pc", "heun")
    assert S.sampler_name(old, comfy_samplers) == new
    assert S.sampler_name("heun", comfy_samplers) == "heun"


def test_an_unknown_sampler_is_refused_naming_the_input():
    with pytest.raises(Wan22InputError) as e:
        S.sampler_name("ddim_plus", ("euler", "uni_pc"))
    assert e.value.input_name == "sampler" and "'ddim_plus'" in str(e.value) and "KSampler samplers" in str(e.value)


@pytest.mark.parametrize("kwargs,input_name,fix", [
    ({"steps": 0}, "steps", "between 1 and"),
    ({"steps": -3}, "steps", "between 1 and"),
    ({"flow_shift": 0.0}, "flow_shift", "greater than 0"),
    ({"flow_shift": -1.0}, "flow_shift", "greater than 0"),
    ({"flow_shift": math.nan}, "flow_shift", "greater than 0"),
    ({"boundary_ratio": 1.5}, "boundary_ratio", "outside [0, 1]"),
    ({"boundary_ratio": -0.1}, "boundary_ratio", "outside [0, 1]"),
    ({"boundary": "sometimes"}, "boundary", "use 'auto' or 'custom'"),
    ({"scheduler": "cosine", "schedulers": ("simple", "beta")}, "scheduler", "use one of simple, beta"),
])
def test_out_of_range_inputs_are_refused_with_the_input_and_the_fix(kwargs, input_name, fix):
    with pytest.raises(Wan22InputError) as e:
        S.check_schedule_inputs(**kwargs)
    assert e.value.input_name == input_name
    assert str(e.value).startswith(input_name + ":") and fix in str(e.value)


def test_linked_inputs_not_yet_known_are_not_refused():
    S.check_schedule_inputs(steps=None, flow_shift=None, boundary=None, boundary_ratio=None, scheduler=None)


def test_the_run_takes_the_steps_its_sigmas_have():
    """ComfyUI's ddim_uniform gives 13 sigmas for 11 steps, and KSampler steps through all 12: so does the split."""
    schedule = S.build_schedule(sampler="euler", scheduler="ddim_uniform", steps=3, flow_shift=5.0, sigmas=LIGHTX2V,
                                has_high=True, has_low=True, model_default=0.875)
    assert (schedule.steps, schedule.run_steps, schedule.split) == (3, 4, (2, 2))
    assert schedule.stage_bounds("low") == (2, 4) and schedule.stage_sigmas("low") == LIGHTX2V[2:]
    assert "3 steps (ddim_uniform makes them 4)" in schedule.summary()
    with pytest.raises(ValueError, match="at least one step"):
        S.build_schedule(sampler="euler", scheduler="simple", steps=5, flow_shift=5.0, sigmas=(1.0,), has_high=True,
                         has_low=True, model_default=0.875)


def test_schedule_is_a_printable_comparable_value():
    a, b = schedule_of(LIGHTX2V), schedule_of(list(LIGHTX2V))
    assert a == b and hash(a) == hash(b)
    assert a.summary() == "euler/simple, 4 steps, shift 5, boundary 0.875 (model_default): 2 high / 2 low"
    assert a.split == (2, 2) and a.sigmas == LIGHTX2V


# --- a lead stage in front of the main schedule ---

MAIN_8 = (1.0, 0.9722, 0.9375, 0.8929, 0.8333, 0.75, 0.625, 0.4167, 0.0)  # euler/simple 8 steps, shift 5


def test_the_lead_hands_over_where_its_sigma_reaches_the_main_start_exactly_or_with_a_step_of_its_own():
    assert S.lead_hand_off((1.0, 0.99, 0.98, 0.9722, 0.96, 0.0), 0.9722) == (3, True)
    assert S.lead_hand_off((1.0, 0.99, 0.98, 0.97, 0.96, 0.0), 0.9722) == (3, False)  # 0.98 -> 0.9722
    assert S.lead_hand_off((1.0, 0.0), 0.9722) == (1, False)  # a one-step lead schedule: one step to the start


def test_a_schedule_with_a_lead_runs_lead_then_main_from_its_start_step_split_at_the_boundary():
    main = schedule_of(MAIN_8)
    assert main.split == (4, 4)
    led = S.add_lead(main, lead_sigmas=(1.0, 0.99, 0.98, 0.9722, 0.96, 0.5, 0.0), steps=6, start_step=1, cfg=3.5)
    assert led.stage_steps() == {"lead": 3, "high": 3, "low": 4}
    assert led.stage_sigmas("lead") == (1.0, 0.99, 0.98, 0.9722)
    assert led.stage_sigmas("high") == MAIN_8[1:5] and led.stage_sigmas("low") == MAIN_8[4:]
    assert led.lead.exact and "exact" in led.lead.hand_off() and "3 lead (of 6) / 3 high / 4 low" in led.summary()
    off = S.add_lead(main, lead_sigmas=(1.0, 0.99, 0.98, 0.97, 0.96, 0.5, 0.0), steps=6, start_step=1, cfg=3.5)
    assert off.stage_sigmas("lead") == (1.0, 0.99, 0.98, 0.9722) and not off.lead.exact
    assert "a step of its own size" in off.lead.hand_off()
    assert main.lead is None and main.stage_steps() == {"high": 4, "low": 4}  # the handle it was made from


def test_a_lead_past_the_switch_leaves_the_main_high_stage_empty():
    led = S.add_lead(schedule_of(MAIN_8), lead_sigmas=(1.0, 0.8, 0.0), steps=2, start_step=5, cfg=3.5)
    assert led.stage_steps() == {"lead": 2, "low": 3} and led.stage_sigmas("low") == MAIN_8[5:]


@pytest.mark.parametrize("kwargs, input_name", [
    (dict(steps=0, start_step=1, cfg=3.5), "lead_steps"),
    (dict(steps=6, start_step=0, cfg=3.5), "start_step"),
    (dict(steps=6, start_step=8, cfg=3.5), "start_step"),
    (dict(steps=6, start_step=1, cfg=math.nan), "cfg"),
])
def test_a_lead_that_cannot_run_is_refused_naming_the_input(kwargs, input_name):
    with pytest.raises(Wan22InputError) as e:
        S.add_lead(schedule_of(MAIN_8), lead_sigmas=(1.0,) * 6 + (0.0,), **kwargs)
    assert e.value.input_name == input_name


def test_a_lead_needs_a_high_noise_expert_and_only_one_lead():
    with pytest.raises(Wan22InputError, match="no high-noise expert"):
        S.add_lead(schedule_of(MAIN_8, has_high=False), lead_sigmas=(1.0, 0.0), steps=1, start_step=1, cfg=3.5)
    led = S.add_lead(schedule_of(MAIN_8), lead_sigmas=(1.0, 0.0), steps=1, start_step=1, cfg=3.5)
    with pytest.raises(Wan22InputError, match="already has a lead"):
        S.add_lead(led, lead_sigmas=(1.0, 0.0), steps=1, start_step=1, cfg=3.5)
