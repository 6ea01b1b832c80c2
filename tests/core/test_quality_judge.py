"""bench.quality's checks, fed small result dictionaries: each names what it checks and holds only where the
figures hold (every check here was seen to fail on a result that should fail)."""

import pytest

from bench.quality import judge
from bench.quality.settings import BAND, DEFAULTS_BOUND, MAX_BUDGET_WORK, REFUSED_BUDGET


def point(method, threshold, error, cost, estimate=None, **extra):
    p = {"method": method, "threshold": threshold, "rel_l2": {"median": error, "min": error, "max": error},
         "block_cost": {"median": cost, "min": cost, "max": cost}, **extra}
    if estimate is not None:
        p["estimate"] = {"median": estimate, "min": estimate, "max": estimate}
    return p


def budget(threshold, error, cost, work=2.0):
    return point("budget", threshold, error, cost, work_in_full_runs=work)


def bed(*points, steps=20):
    """A bed's results at one step count: `points`, and the node's defaults within their bounds where not given."""
    points = list(points)
    if not any(p["method"] == "defaults" for p in points):
        points.append(point("defaults", 0.0175, 0.01, 0.8))
    return {"bed": {"name": "tuning", "role": "tuning"}, "step_counts": [{"steps": steps, "points": points}]}


def verdicts(result) -> dict:
    """check text -> holds, the bed's name and step count left out."""
    return {c["check"].split(": ", 1)[1]: c["holds"] for c in judge.checks(result)}


def one(result, starts: str) -> bool:
    found = [holds for text, holds in verdicts(result).items() if text.startswith(starts)]
    assert len(found) == 1, verdicts(result)
    return found[0]


def test_the_defaults_hold_within_both_bounds_and_fail_past_either():
    e, c = DEFAULTS_BOUND["rel_l2"], DEFAULTS_BOUND["block_cost"]
    assert one(bed(point("defaults", 0.0175, e, c)), "the Cache-DiT node's defaults")
    assert not one(bed(point("defaults", 0.0175, e * 1.01, c)), "the Cache-DiT node's defaults")
    assert not one(bed(point("defaults", 0.0175, e, c + 0.01)), "the Cache-DiT node's defaults")


def test_a_peer_point_needs_a_point_of_ours_at_no_more_error_and_no_more_block_cost():
    defaults = point("defaults", 0.0175, 0.02, 0.8)
    lazy = point("lazycache", 0.1, 0.005, 0.95)
    assert not one(bed(defaults, lazy), "a point of ours")  # ours: more error
    assert one(bed(defaults, lazy, point("ours_error", 0.005, 0.005, 0.95)), "a point of ours")
    assert not one(bed(defaults, lazy, point("ours_error", 0.005, 0.004, 0.96)), "a point of ours")  # more cost
    refused = {"method": "budget", "threshold": 0.03, "refused": "no cached step"}
    assert not one(bed(defaults, lazy, refused), "a point of ours")  # a refused point dominates nothing
    # a peer point that skips nothing, or costs more than 0.1, is not judged
    assert "a point of ours" not in str(verdicts(bed(defaults, point("easycache", 0.1, 0.0, 1.0),
                                                     point("easycache", 0.3, 0.2, 0.5))))


@pytest.mark.parametrize("error, estimate, holds", [(0.02, 0.02, True), (0.02 * BAND[1], 0.02 * BAND[1], True),
                                                    (0.02 * BAND[1] * 1.01, 0.03, False),  # over the target
                                                    (0.02, 0.02 / BAND[1] * 0.99, False),  # over its estimate
                                                    (0.02 * BAND[0] * 0.99, 0.012, False),  # under the target
                                                    (0.02, 0.0, False)])  # an estimate of nothing
def test_a_target_is_in_band_when_its_error_is_near_it_and_near_its_estimate(error, estimate, holds):
    assert judge.in_band(point("ours_error", 0.02, error, 0.8, estimate)) is holds


def test_a_target_that_caches_nothing_is_a_right_answer_not_a_miss():
    assert judge.in_band(point("ours_error", 0.01, 0.0, 1.0, 0.0)) is None
    held = judge.band_checks("b", 20, [point("ours_error", 0.01, 0.0, 1.0, 0.0),
                                       point("ours_error", 0.02, 0.02, 0.8, 0.02)])
    assert [c["holds"] for c in held] == [True] and "0.01: caches nothing" in held[0]["value"]


def test_the_band_check_fails_on_one_target_out_and_judges_only_the_targets_it_names():
    inside = point("ours_taylorseer", 0.03, 0.03, 0.7, 0.03)
    outside = point("ours_taylorseer", 0.05, 0.02, 0.6, 0.045)  # 0.4 x its target
    beyond = point("ours_taylorseer", 0.1, 0.5, 0.3, 0.1)  # past the targets the band is checked at
    assert [c["holds"] for c in judge.band_checks("b", 40, [inside, beyond])] == [True]
    assert [c["holds"] for c in judge.band_checks("b", 40, [inside, outside])] == [False]


def test_the_frontier_needs_a_point_of_ours_within_its_error_at_its_share_of_the_blocks():
    """At 20 steps: a point at a median error <= 0.03 and at most 0.55 of the blocks; a cheaper point with more
    error, or a peer's, does not count; at 40 steps the bound is 0.40."""
    frontier = "the frontier: at a median error <= 0.03, at most"
    assert one(bed(point("ours_error", 0.03, 0.029, 0.55), point("ours_error", 0.05, 0.05, 0.3)), frontier)
    assert not one(bed(point("ours_error", 0.03, 0.031, 0.5), point("lazycache", 0.2, 0.01, 0.4)), frontier)
    assert not one(bed(point("ours_taylorseer", 0.03, 0.02, 0.56)), frontier)
    assert one(bed(point("ours_threshold", 0.08, 0.02, 0.40), steps=40), frontier)
    assert not one(bed(point("ours_threshold", 0.08, 0.02, 0.41), steps=40), frontier)


def test_a_budget_holds_when_met_within_its_work_and_its_block_cost_falls_as_it_grows():
    assert one(bed(budget(0.03, 0.03, 0.8)), "budget 0.03 met")
    assert not one(bed(budget(0.03, 0.031, 0.8)), "budget 0.03 met")
    assert not one(bed(budget(0.03, 0.02, 0.8, work=MAX_BUDGET_WORK + 0.1)), "budget 0.03 met")
    assert not one(bed({"method": "budget", "threshold": 0.05, "refused": "no cached step"}), "budget 0.05 met")
    assert one(bed(budget(0.03, 0.02, 0.8), budget(0.05, 0.04, 0.7)), "block cost falls")
    assert not one(bed(budget(0.03, 0.02, 0.8), budget(0.05, 0.04, 0.8)), "block cost falls")  # equal: no fall


def test_a_budget_below_any_step_holds_only_when_refused_naming_error_budget():
    refused = {"method": "budget", "threshold": REFUSED_BUDGET, "refused": "error_budget: ...",
               "refused_input": "error_budget"}
    assert one(bed(refused), f"budget {REFUSED_BUDGET:g} (below any cached step)")
    assert not one(bed({**refused, "refused_input": "calibration_size"}), f"budget {REFUSED_BUDGET:g}")
    assert not one(bed(budget(REFUSED_BUDGET, 0.0, 1.0)), f"budget {REFUSED_BUDGET:g}")


def test_the_propagation_is_a_single_steps_error_over_its_gap_times_the_miss():
    tuning = {"single_steps": [{"sigmas": [1.0, 0.9, 0.5, 0.0], "cases": [
        {"skips": {"1": 0.04, "2": 0.0}, "misses": {"1": 0.1, "2": 0.2}}]}]}
    assert judge.propagations(tuning) == [(0.9, pytest.approx(0.04 / (0.1 * 0.4)))]  # a step that missed nothing: out
