"""The parallel plan's pure rules: devices, degrees, the sequence split and the report."""

import pytest

from wan22_cachedit.nodes.core import parallel
from wan22_cachedit.nodes.core.errors import Wan22InputError

A14B_HEADS = 40


def plan(**changes):
    values = dict(workers=2, devices="auto", ulysses_degree=2, cpu_threads=0, gpus=0, cpus=8)
    return parallel.make_plan(**{**values, **changes})


def refusal(**changes) -> str:
    with pytest.raises(Wan22InputError) as e:
        plan(**changes)
    return str(e.value)


def test_auto_takes_this_machines_gpus_else_its_cpu():
    assert plan(gpus=4).devices == ("cuda:0", "cuda:1") and plan(gpus=4).backend == "nccl"
    cpu = plan()
    assert cpu.devices == ("cpu", "cpu") and cpu.backend == "gloo" and cpu.cpu_threads == 4
    assert plan(cpu_threads=1).cpu_threads == 1
    assert refusal(cpu_threads=-1).startswith("cpu_threads: -1 threads: use 0 (share the cores) up to")


def test_any_degree_splits_the_a14b_heads_the_ones_it_does_not_divide_padded():
    for degree in (2, 3, 4, 5, 6, 7, 8):
        assert plan(workers=degree, ulysses_degree=degree, gpus=8).ulysses_degree == degree
    assert [parallel.local_heads(A14B_HEADS, d) for d in (2, 3, 6, 7, 8)] == [20, 14, 7, 6, 5]
    assert parallel.local_heads(2, 3) == 1  # three workers on two heads: one empty head
    assert refusal(ulysses_degree=1).startswith("ulysses_degree: 1 splits nothing")
    assert refusal(workers=4, gpus=4).startswith("ulysses_degree: 2 with 4 workers")


def test_devices_are_refused_by_name():
    assert refusal(workers=3, gpus=2).startswith("workers: 3 workers but this machine has 2 GPU(s)")
    assert refusal(workers=3, devices="cuda:0, cuda:1", ulysses_degree=3).startswith(
        "workers: more workers (3) than devices (2: cuda:0, cuda:1)")
    assert refusal(devices="cuda:0, cuda:0", gpus=2).startswith("devices: 'cuda:0, cuda:0' names a GPU twice")
    assert refusal(devices="cpu, cuda").startswith("devices: 'cpu, cuda' mixes CPU and GPU workers")
    assert refusal(devices="cuda:0, cuda", gpus=2).startswith("devices: 'cuda:0, cuda' mixes pinned GPUs")
    assert plan(devices="cpu:0, cpu:1").devices == ("cpu", "cpu")
    assert refusal(devices="gpu0, gpu1").startswith("devices: 'gpu0, gpu1' is not a device list")
    assert refusal(workers=1).startswith("workers: 1 workers")
    assert plan(devices="CUDA, cuda", gpus=2).devices == ("cuda", "cuda")  # GPUs the Ray cluster picks
    assert plan(devices="cpu, cpu, cpu").devices == ("cpu", "cpu")
    assert refusal(workers=3, devices="cuda:0, cuda:1", ulysses_degree=3, gpus=2).startswith("workers: more")


def test_a_workflow_cannot_ask_for_more_than_the_machine_has():
    """Bounds, each refused by its input name by the plan node, before any worker starts."""
    assert refusal(workers=4, ulysses_degree=4, devices="cpu, cpu, cpu, cpu", cpus=2).startswith(
        "workers: 4 CPU workers but this machine has 2 CPU cores")
    assert plan(workers=2, devices="cpu, cpu", cpus=2).devices == ("cpu", "cpu")
    assert refusal(cpu_threads=1024, cpus=8) == ("cpu_threads: 1024 threads: use 0 (share the cores) up to this "
                                                 "machine's 8 cores")
    assert plan(cpu_threads=8, cpus=8).cpu_threads == 8
    message = refusal(devices="cuda:999, cuda:998", gpus=0)
    assert message.startswith("devices: 'cuda:999, cuda:998' names cuda:999, cuda:998, but this process sees 0 "
                              "GPU(s)")
    assert refusal(devices="cuda:0, cuda:2", gpus=2).startswith("devices: 'cuda:0, cuda:2' names cuda:2, but this "
                                                                "process sees 2 GPU(s) (cuda:0 to cuda:1)")
    assert refusal(devices="cuda, cuda", gpus=1).startswith("devices: 'cuda, cuda' asks for 2 GPUs, but this "
                                                            "process sees 1")
    assert plan(devices="cuda, cuda", gpus=0, cluster=True).devices == ("cuda", "cuda")  # the cluster's GPUs
    assert refusal(devices="cuda:3, cuda:1", gpus=2, cluster=True).startswith("devices: 'cuda:3, cuda:1' names "
                                                                               "cuda:3")


def test_any_sequence_splits_the_first_shards_a_token_longer_and_each_mean_weighed_by_its_share():
    assert parallel.latent_tokens((1, 16, 21, 60, 104)) == 21 * 30 * 52  # 832x480, 81 frames
    assert parallel.latent_tokens((1, 16, 2, 5, 5)) == 2 * 3 * 3  # padded up to whole patches
    parallel.check_sequence(21 * 30 * 52, 7)
    parallel.check_sequence(2, 2)
    with pytest.raises(Wan22InputError, match="the video's 1 tokens .* are fewer than the 2 workers"):
        parallel.check_sequence(1, 2)
    shards = [parallel.shard(12, 3, rank) for rank in range(3)]
    assert [(s.start, s.stop) for s in shards] == [(0, 4), (4, 8), (8, 12)]
    assert parallel.shard_sizes(11, 3) == [4, 4, 3] and parallel.shard(11, 3, 2) == slice(8, 11)
    assert [parallel.statistic_weight(12, 3, r) for r in range(3)] == [1.0, 1.0, 1.0]
    # the plain average of the weighed means of shards of ones and twos is the whole sequence's mean
    values = [1.0] * 6 + [2.0] * 5
    means = [sum(values[parallel.shard(11, 3, r)]) / parallel.shard_sizes(11, 3)[r] for r in range(3)]
    weighed = sum(parallel.statistic_weight(11, 3, r) * m for r, m in enumerate(means)) / 3
    assert weighed == pytest.approx(sum(values) / 11) and sum(means) / 3 != pytest.approx(sum(values) / 11)


def test_the_mesh_groups_consecutive_ranks_by_prompt_and_matching_places_by_sequence():
    assert parallel.mesh_groups(4, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    assert parallel.mesh_groups(6, 2) == ([[0, 1, 2], [3, 4, 5]], [[0, 3], [1, 4], [2, 5]])
    assert parallel.mesh_groups(2, 2) == ([[0], [1]], [[0, 1]])
    assert [parallel.mesh_place(r, 4, 2) for r in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_the_report_gives_each_ranks_time_and_communication_share():
    p = plan(cpu_threads=1)
    ranks = [{"seconds": 2.0, "comm_seconds": 0.5, "cached_steps": {"low": [3]}, "contexts": {"low": [10]}},
             {"seconds": 4.0, "comm_seconds": 1.0, "cached_steps": {"low": [3]}, "contexts": {"low": [10]}}]
    report = parallel.parallel_report(p, ranks)
    assert report["rank_seconds"] == [2.0, 4.0] and report["communication_share"] == [0.25, 0.25]
    assert report["ranks_agree"] and report["devices"] == ["cpu", "cpu"] and report["cpu_threads"] == 1
    ranks[1]["cached_steps"] = {"low": [4]}
    assert not parallel.parallel_report(p, ranks)["ranks_agree"]
    ranks[1]["cached_steps"] = {"low": [3]}
    ranks[0]["residual_diffs"], ranks[1]["residual_diffs"] = {"low": {"3": 0.1}}, {"low": {"3": 0.2}}
    assert not parallel.parallel_report(p, ranks)["ranks_agree"]


def test_each_stage_splits_its_prompts_at_cfg_above_one_with_even_workers_else_its_sequence():
    auto = plan(split="auto")
    assert (auto.stage_split(3.5), auto.stage_split(1.0), auto.stage_split(1.01)) == ("cfg", "ulysses", "cfg")
    assert plan(workers=4, ulysses_degree=4, split="auto").stage_split(3.5) == "cfg"  # the mesh
    assert plan(workers=3, ulysses_degree=3, split="auto").stage_split(3.5) == "ulysses"  # three do not halve
    assert plan(split="cfg").stage_split(1.0) == "ulysses"  # one prompt: nothing to share but the sequence
    assert plan().split == "ulysses" and plan().stage_split(4.0) == "ulysses"  # what saved workflows ran with
    assert plan(split="cfg").summary()["split"] == "cfg"


def test_dmd_is_refused_by_name_where_a_stage_cuts_the_sequence_and_runs_where_each_worker_holds_a_prompt():
    """DMD fits each prompt's whole hidden state, so a worker's shard would forecast otherwise than one process;
    two workers that each hold one prompt (the CFG split) forecast as it does, and element-wise calibrators run."""
    auto = plan(split="auto")
    assert not auto.splits_sequence(3.5) and auto.splits_sequence(1.0)
    assert plan(workers=4, ulysses_degree=4, split="auto").splits_sequence(3.5)  # the mesh: each half splits
    parallel.refuse_calibrator(auto, "dmd", {"high": 3.5, "low": 3.0})  # CFG split at both stages: runs
    for calibrator in ("none", "taylorseer", "foca"):
        parallel.refuse_calibrator(plan(), calibrator, {"high": 3.5, "low": 1.0})
    with pytest.raises(Wan22InputError) as refused:
        parallel.refuse_calibrator(auto, "dmd", {"high": 3.5, "low": 1.0})
    assert refused.value.input_name == "calibrator" and "cuts the sequence across workers at low" in str(refused.value)


def test_a_split_that_cannot_run_is_refused_by_name():
    assert refusal(split="sideways").startswith("split: unknown split 'sideways': use one of auto, ulysses, cfg")
    assert refusal(workers=3, ulysses_degree=3, split="cfg").startswith(
        "split: the CFG split shares the two prompts of each evaluation between two halves of the workers, and 3 "
        "workers do not halve")
    assert plan(workers=6, ulysses_degree=6, split="cfg").stage_split(3.5) == "cfg"  # a 2 x 3 mesh


def test_the_report_says_how_each_stage_was_split():
    ranks = [{"seconds": 1.0, "comm_seconds": 0.1, "cached_steps": {}, "contexts": {},
              "splits": {"high": "cfg", "low": "ulysses"}}] * 2
    assert parallel.parallel_report(plan(split="auto"), ranks)["stage_splits"] == {"high": "cfg", "low": "ulysses"}


def test_a_refusal_crosses_processes_as_it_was_raised():
    """A worker's refusal reaches ComfyUI pickled (parallel/worker.py -> driver -> ComfyUI): the same input name
    and text, not a TypeError from rebuilding it with one argument."""
    import pickle

    refusal = Wan22InputError("error_budget", "0.01 cannot be met " + "x" * 300)
    again = pickle.loads(pickle.dumps(refusal))
    assert type(again) is Wan22InputError
    assert (again.input_name, str(again)) == (refusal.input_name, str(refusal))
