"""The split, boundary precedence and input checks, on diffusers' real schedulers (no ComfyUI)."""

import math

import pytest

from wan22_cachedit.nodes.core import schedule as S
from wan22_cachedit.nodes.core.errors import Wan22InputError


def split_of(sampler, steps, shift, boundary, has_high=True, has_low=True, custom=None):
    return S.build_schedule(sampler=sampler, steps=steps, flow_shift=shift, has_high=has_high, has_low=has_low,
                            model_default=boundary, custom_ratio=custom).split


@pytest.mark.parametrize("sampler,steps,shift,boundary,expected", [
    ("unipc", 40, 5.0, 0.875, (17, 23)),
    ("unipc", 40, 12.0, 0.875, (26, 14)),
    ("unipc", 40, 5.0, 0.900, (15, 25)),
    ("euler", 40, 5.0, 0.900, (14, 26)),
    ("unipc", 20, 12.0, 0.875, (13, 7)),
    ("unipc", 40, 3.0, 0.875, (13, 27)),
    ("euler", 40, 3.0, 0.875, (12, 28)),
    ("dpmpp", 40, 3.0, 0.875, (12, 28)),
    ("unipc", 1, 5.0, 0.875, (1, 0)),
    ("euler", 1, 12.0, 0.875, (1, 0)),
    ("dpmpp", 1, 8.0, 0.875, (1, 0)),
])
def test_split_matches_the_measured_vectors(sampler, steps, shift, boundary, expected):
    assert split_of(sampler, steps, shift, boundary) == expected


@pytest.mark.parametrize("sampler", list(S.SAMPLERS))
@pytest.mark.parametrize("steps", [1, 4, 40])
def test_low_noise_only_runs_every_step_low_even_where_euler_starts_at_1000(sampler, steps):
    schedule = S.build_schedule(sampler=sampler, steps=steps, flow_shift=5.0, has_high=False, has_low=True,
                                model_default=0.875, custom_ratio=1.0)
    assert schedule.split == (0, steps)
    assert schedule.boundary == S.Boundary(None, "low_noise_only")
    assert not any(schedule.boundary.routes_high(t) for t in schedule.timesteps)


@pytest.mark.parametrize("sampler", list(S.SAMPLERS))
def test_high_noise_only_runs_every_step_high(sampler):
    schedule = S.build_schedule(sampler=sampler, steps=30, flow_shift=5.0, has_high=True, has_low=False,
                                model_default=0.875, custom_ratio=0.0)
    assert schedule.split == (30, 0)
    assert schedule.boundary.source == "high_noise_only"


def test_euler_first_timestep_is_1000_so_a_ratio_of_one_still_routes_it_high():
    # The trap that makes pinning necessary: comparing 1000.0 >= 1.0 * 1000 says "high".
    assert S.make_scheduler("euler", 10, 5.0).timesteps[0] == 1000.0
    assert split_of("euler", 10, 5.0, 0.875, custom=1.0) == (1, 9)
    assert split_of("unipc", 10, 5.0, 0.875, custom=1.0) == (0, 10)
    assert split_of("unipc", 10, 5.0, 0.875, custom=0.0) == (10, 0)


def test_boundary_precedence_pinned_then_custom_then_model_default():
    r = S.resolve_boundary
    assert r(has_high=True, has_low=True, model_default=0.9) == S.Boundary(0.9, "model_default")
    assert r(has_high=True, has_low=True, model_default=0.9, custom_ratio=0.8) == S.Boundary(0.8, "custom")
    assert r(has_high=False, has_low=True, model_default=0.9, custom_ratio=0.8) == S.Boundary(None, "low_noise_only")
    assert r(has_high=True, has_low=False, model_default=0.9, custom_ratio=0.8) == S.Boundary(None, "high_noise_only")
    with pytest.raises(Wan22InputError, match="load at least one"):
        r(has_high=False, has_low=False, model_default=0.9)


def test_successive_schedules_with_different_boundaries_do_not_influence_each_other():
    splits = [split_of("unipc", 40, 12.0, 0.875, custom=c) for c in (0.95, None, 0.8, None)]
    assert splits[1] == splits[3] == (26, 14)
    assert splits[0] != splits[1] != splits[2]
    assert splits[0] == split_of("unipc", 40, 12.0, 0.875, custom=0.95)


def test_the_loop_scheduler_gives_the_timesteps_the_split_was_counted_from():
    schedule = S.build_schedule(sampler="unipc", steps=40, flow_shift=12.0, has_high=True, has_low=True,
                                model_default=0.875)
    scheduler = schedule.new_scheduler()
    assert tuple(float(t) for t in scheduler.timesteps) == schedule.timesteps
    assert S.count_split(scheduler.timesteps, schedule.boundary) == schedule.split == (26, 14)
    assert scheduler is not schedule.new_scheduler()  # each run steps a fresh scheduler


@pytest.mark.parametrize("kwargs,input_name,fix", [
    ({"steps": 0}, "steps", "between 1 and"),
    ({"steps": -3}, "steps", "between 1 and"),
    ({"flow_shift": 0.0}, "flow_shift", "greater than 0"),
    ({"flow_shift": -1.0}, "flow_shift", "greater than 0"),
    ({"flow_shift": math.nan}, "flow_shift", "greater than 0"),
    ({"boundary_ratio": 1.5}, "boundary_ratio", "outside [0, 1]"),
    ({"boundary_ratio": -0.1}, "boundary_ratio", "outside [0, 1]"),
    ({"sampler": "ddim"}, "sampler", "use one of unipc, euler, dpmpp"),
    ({"boundary": "sometimes"}, "boundary", "use 'auto' or 'custom'"),
])
def test_out_of_range_inputs_are_refused_with_the_input_and_the_fix(kwargs, input_name, fix):
    with pytest.raises(Wan22InputError) as e:
        S.check_schedule_inputs(**kwargs)
    assert e.value.input_name == input_name
    assert str(e.value).startswith(input_name + ":") and fix in str(e.value)


def test_linked_inputs_not_yet_known_are_not_refused():
    S.check_schedule_inputs(None, None, None, None, None)


def test_schedule_is_a_printable_comparable_value():
    a = S.build_schedule(sampler="unipc", steps=20, flow_shift=12.0, has_high=True, has_low=True, model_default=0.875)
    b = S.build_schedule(sampler="unipc", steps=20, flow_shift=12.0, has_high=True, has_low=True, model_default=0.875)
    assert a == b and hash(a) == hash(b)
    assert a.summary() == "unipc, 20 steps, shift 12, boundary 0.875 (model_default): 13 high / 7 low"
    assert a.to_dict()["split"] == {"high": 13, "low": 7}
