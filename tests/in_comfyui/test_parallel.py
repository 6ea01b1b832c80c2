"""The parallel plan on two Ray workers on the CPU (gloo), in a real ComfyUI: each run equals the same graph
in one process, the cache decides on every rank as one process would, faults end in a clear error and leave
no state behind, and the workers are released when the plan goes or ComfyUI unloads its models."""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil
import pytest
import torch

from . import prompts as P
from .test_variants import conditioned

pytest.importorskip("ray", reason="the parallel plan's tests need Ray (requirements-dev.txt)")
pytest.importorskip("yunchang", reason="the parallel plan's tests need yunchang (requirements-dev.txt)")

PLAN = {"workers": 2, "devices": "cpu, cpu", "ulysses_degree": 2, "cpu_threads": 1}
RUN = dict(width=32, height=32, length=5, steps=6, flow_shift=5.0)
# The split changes the matmul shapes each rank computes, so the last bits may differ: float32 rounding, which
# grows with the values (an absolute 1e-5 held on one set-up and not on another, where 1.14e-5 was measured).
ONE_PROCESS = 1e-5  # per unit of the largest value


def near_one_process(latent, alone) -> bool:
    return (latent - alone).abs().max().item() <= ONE_PROCESS * max(1.0, alone.abs().max().item())


def plan_node(experts_from, **overrides):
    return {"class_type": "Wan22ParallelPlan", "inputs": {"experts": [experts_from, 0], **PLAN, **overrides}}


def with_plan(prompt: dict, **overrides) -> dict:
    """The prompt with the plan node ("70") right before the sampler."""
    p = {k: {**v, "inputs": dict(v["inputs"])} for k, v in prompt.items()}
    p["70"] = plan_node(p["5"]["inputs"]["experts"][0], **overrides)
    p["5"]["inputs"]["experts"] = ["70", 0]
    return p


def two_heads(parallel_experts, tiny_models, task="t2v", experts="both", **run):
    high = parallel_experts[(task, "high")] if experts == "both" else "none"
    loader = P.loader(high, parallel_experts[(task, "low")])
    return P.our_prompt(loader, P.text_folder(tiny_models), **{**RUN, **run})


def parallel_module(comfyui):
    """The warm pool's registry (release, the warm pool) as ComfyUI loaded it."""
    return comfyui.pack("nodes.parallel.registry")


def no_process_left(pids, within=60.0) -> list[int]:
    """The worker processes still alive after `within` seconds (a hang guard: they usually go at once)."""
    deadline = time.monotonic() + within
    while True:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


CASES = {
    "t2v-uni_pc-cfg": dict(task="t2v", sampler="uni_pc", cfg=(4.0, 3.0)),
    "t2v-euler-cfg1-lora": dict(task="t2v", sampler="euler", cfg=(1.0, 1.0), lora=True),
    "t2v-low-alone-euler-cfg": dict(task="t2v", sampler="euler", cfg=(3.5, 3.5), experts="low"),
    "i2v-uni_pc-cfg": dict(task="i2v", sampler="uni_pc", cfg=(3.5, 3.5)),
    "i2v-euler-cfg1-lora": dict(task="i2v", sampler="euler", cfg=(1.0, 1.0), lora=True),
}


# make test keeps the first case; the others run under `make test-slow` (CI runs both), to keep make test
# under 20 minutes on two cores.
@pytest.mark.parametrize("case", [pytest.param(c, marks=() if i == 0 else pytest.mark.slow, id=c)
                                  for i, c in enumerate(CASES)])
def test_uncached_run_equals_one_process(comfyui, tiny_models, parallel_experts, start_image, case):
    c = dict(CASES[case])
    task, lora, experts = c.pop("task"), c.pop("lora", False), c.pop("experts", "both")
    if lora:
        c["lora"] = {"high": parallel_experts[("lora", "high")] if experts == "both" else "none",
                     "low": parallel_experts[("lora", "low")]}
    prompt = two_heads(parallel_experts, tiny_models, task, experts, **c)
    if task == "i2v":
        prompt = P.with_start_image(prompt, ["5"])
    alone_report = P.report_of(P.run_ok(comfyui, prompt))
    alone = P.latent_of(comfyui, "5")
    report = P.report_of(P.run_ok(comfyui, with_plan(prompt)))
    split = P.latent_of(comfyui, "5")
    assert report["split"] == alone_report["split"] and report["loras"] == alone_report["loras"]
    assert report["transformer_calls"] == alone_report["transformer_calls"]
    assert report["parallel"]["workers"] == 2 and report["parallel"]["devices"] == ["cpu", "cpu"]
    assert near_one_process(split, alone)
    assert not torch.equal(split, torch.zeros_like(split))


@pytest.mark.slow
def test_fun_camera_experts_on_workers_equal_one_process(comfyui, tiny_models, parallel_experts, start_image):
    """Fun-Camera's adapter adds the camera path to the patch embedding before the block loop, so the sequence
    split cuts it with the tokens: the camera conditioning crosses to the workers and the run equals one
    process's."""
    prompt = conditioned(two_heads(parallel_experts, tiny_models, "fun_camera", sampler="euler", cfg=(3.5, 3.5)),
                         ["5"], "fun_camera", os.path.basename(start_image))
    alone = P.report_of(P.run_ok(comfyui, prompt))
    alone_latent = P.latent_of(comfyui, "5")
    report = P.report_of(P.run_ok(comfyui, with_plan(prompt)))
    assert report["split"] == alone["split"] and report["parallel"]["workers"] == 2
    assert near_one_process(P.latent_of(comfyui, "5"), alone_latent)


@pytest.mark.slow
def test_three_stages_with_the_lead_on_workers_equal_one_process(comfyui, tiny_models, parallel_experts):
    """The three-stage recipe: the lead stage's expert (the loader's, without the LoRAs) is rebuilt in each
    worker as well, and the three stages equal one process's."""
    loras = {"high": parallel_experts[("lora", "high")], "low": parallel_experts[("lora", "low")]}
    prompt = two_heads(parallel_experts, tiny_models, sampler="euler", steps=8, cfg=(1.0, 1.0), lora=loras)
    prompt["41"] = P.lead_node(lead_steps=24, start_step=1, cfg=3.5)
    prompt["5"]["inputs"]["schedule"] = ["41", 0]
    alone = P.report_of(P.run_ok(comfyui, prompt))
    alone_latent = P.latent_of(comfyui, "5")
    report = P.report_of(P.run_ok(comfyui, with_plan(prompt)))
    assert report["split"] == alone["split"] == {"lead": 3, "high": 3, "low": 4}
    assert report["parallel"]["workers"] == 2
    assert near_one_process(P.latent_of(comfyui, "5"), alone_latent)


def test_seeds_a_b_a_on_warm_workers(comfyui, tiny_models, parallel_experts):
    runs = {}
    for i, seed in enumerate((1, 2, 1)):
        P.run_ok(comfyui, with_plan(two_heads(parallel_experts, tiny_models, seed=seed, cfg=(1.0, 1.0))))
        runs[i] = P.latent_of(comfyui, "5")
        if i == 0:
            pids = comfyui.worker_pids()
    assert torch.equal(runs[0], runs[2]) and not torch.equal(runs[0], runs[1])
    assert comfyui.worker_pids() == pids  # the same warm workers served all three


def test_a_budgets_calibration_without_the_plan_releases_the_warm_workers(comfyui, tiny_models, parallel_experts):
    """Every node that runs stages runs them through one place (dispatch.run), with one release policy: after a
    run with the plan, an Error Budget calibrating without one (a prompt with no sampler) leaves no worker."""
    from .test_budget import budget_prompt

    # A prompt no test ran, on the plan the test before leaves warm (and the test after releases first).
    P.run_ok(comfyui, with_plan(two_heads(parallel_experts, tiny_models, seed=71)))
    pids = comfyui.worker_pids()
    assert len(pids) == 2
    prompt, needed, todo = budget_prompt(tiny_models, 0.5, calibration_size=0.5), set(), ["22"]
    while todo:  # the calibration's output and what it needs, nothing else (no sampler)
        node = todo.pop()
        needed.add(node)
        todo += [v[0] for v in prompt[node]["inputs"].values() if isinstance(v, list) and v[0] not in needed]
    P.run_ok(comfyui, {node: prompt[node] for node in needed})
    assert "5" not in needed and comfyui.worker_pids() == [] and no_process_left(pids) == []


@pytest.mark.slow  # 40 steps twice on the workers (make test keeps the cached split of test_parallel_any.py)
def test_cached_run_decides_as_one_process(comfyui, tiny_models, parallel_experts):
    """euler/simple, 40 steps, flow shift 5 then 12 on the same warm workers: every rank's contexts, read
    from cache-dit inside the worker while its stage ran, are one fresh context per stage, every rank has the
    whole sequence's residual statistic, and the cached steps are one process's."""
    prompts, alone, alone_latent = {}, {}, {}
    for shift in (5.0, 12.0):  # one process first: a run without the plan releases the workers
        prompts[shift] = two_heads(parallel_experts, tiny_models, sampler="euler", steps=40, flow_shift=shift,
                                   cfg=(1.0, 1.0), cache=P.CACHING)
        alone[shift] = P.report_of(P.run_ok(comfyui, prompts[shift]))
        alone_latent[shift] = P.latent_of(comfyui, "5")
    assert alone[5.0]["split"] != alone[12.0]["split"]
    pids = None
    for shift in (5.0, 12.0):
        report = P.report_of(P.run_ok(comfyui, with_plan(prompts[shift])))
        pids = pids or comfyui.worker_pids()
        assert comfyui.worker_pids() == pids  # the same warm workers
        parallel = report["parallel"]
        for stage in ("high", "low"):
            one = alone[shift]["cache"][stage]
            assert report["cache"][stage]["evaluations"] == one["evaluations"]
            assert report["cache"][stage]["cached_steps"] == one["cached_steps"]
            assert one["cached_steps"], "the test's threshold should cache some steps"
            assert one["residual_diffs"], "cache-dit should have measured the residual difference"
            for rank in range(2):
                # one context of the stage's own, fresh (read at the stage's first call), CFG 1
                assert parallel["contexts"][rank][stage] == [{"separate_cfg": False, "steps": None, "executed": 0}]
                assert parallel["cached_steps"][rank][stage] == one["cached_steps"]
                # the whole sequence's statistic on every rank (a shard's own would differ from it)
                ranked = parallel["residual_diffs"][rank][stage]
                assert ranked.keys() == one["residual_diffs"].keys(), (rank, stage)
                assert all(abs(ranked[k] - v) <= 1e-4 for k, v in one["residual_diffs"].items()), (rank, stage)
        assert parallel["ranks_agree"]
        assert near_one_process(P.latent_of(comfyui, "5"), alone_latent[shift])


LONG = dict(sampler="euler", steps=60, cfg=(1.0, 1.0), width=64, height=64, length=9)


@pytest.mark.slow
def test_a_worker_killed_mid_run_is_a_clear_error_then_the_prompt_runs_clean(comfyui, tiny_models, parallel_experts,
                                                                           progress_hook):
    prompt = with_plan(two_heads(parallel_experts, tiny_models, **LONG))
    P.run_ok(comfyui, prompt)  # warm workers
    victim = comfyui.worker_pids()[1]
    killed = []

    def kill(value, total, node):
        if node == "5" and value >= 2 and not killed:
            os.kill(victim, signal.SIGKILL)
            killed.append(time.monotonic())
    progress_hook.append(kill)
    message = P.failed_at_run(comfyui, prompt)
    assert killed and time.monotonic() - killed[0] < 60
    assert "workers: worker 1 (cpu) stopped mid-run" in message and "next run starts fresh ones" in message
    assert no_process_left(comfyui.worker_pids() + [victim]) == []
    progress_hook.clear()
    P.run_ok(comfyui, prompt)
    after = P.latent_of(comfyui, "5")
    P.run_ok(comfyui, two_heads(parallel_experts, tiny_models, **LONG))  # no plan: the workers go
    P.run_ok(comfyui, prompt)  # fresh workers: a clean run
    assert torch.equal(after, P.latent_of(comfyui, "5"))


@pytest.mark.parametrize("server_hook", [pytest.param(False, marks=pytest.mark.slow, id="flag"),
                                         pytest.param(True, id="server-hook")])
def test_an_interrupt_stops_every_worker_then_the_prompt_runs_clean(comfyui, tiny_models, parallel_experts,
                                                                   progress_hook, server_hook):
    """A cancel as POST /interrupt sets it (the flag the run polls), and as ComfyUI's server progress hook then
    raises it inside the progress update."""
    import comfy.model_management

    prompt = with_plan(two_heads(parallel_experts, tiny_models, **LONG))
    P.run_ok(comfyui, prompt)
    clean = P.latent_of(comfyui, "5")
    pids = comfyui.worker_pids()

    def interrupt(value, total, node):
        if node == "5" and value >= 2:
            comfy.model_management.interrupt_current_processing(True)
            if server_hook:
                comfy.model_management.throw_exception_if_processing_interrupted()
    progress_hook.append(interrupt)
    result = comfyui.run(prompt, executor=comfyui.new_executor())
    assert result.valid and not result.success
    assert any(event == "execution_interrupted" for event, _ in result.messages)
    progress_hook.clear()
    assert comfyui.worker_pids() == pids  # they stopped together and stay warm
    P.run_ok(comfyui, prompt)
    assert torch.equal(clean, P.latent_of(comfyui, "5"))


def test_no_worker_is_left_after_the_plan_is_removed_or_comfyui_unloads_models(comfyui, tiny_models,
                                                                               parallel_experts):
    import comfy.model_management

    prompt = two_heads(parallel_experts, tiny_models)
    P.run_ok(comfyui, with_plan(prompt))
    pids = comfyui.worker_pids()
    assert len(pids) == 2 and no_process_left(pids, within=0) == pids
    P.run_ok(comfyui, prompt)  # the same graph without the plan
    assert comfyui.worker_pids() == [] and no_process_left(pids) == []
    P.run_ok(comfyui, with_plan(prompt))
    pids = comfyui.worker_pids()
    comfy.model_management.unload_all_models()  # what Unload Models and /free do
    assert comfyui.worker_pids() == [] and no_process_left(pids) == []


@pytest.mark.parametrize("plan, words", [
    (dict(ulysses_degree=1), "ulysses_degree: 1 splits nothing"),
    (dict(workers=2, ulysses_degree=3), "ulysses_degree: 3 with 2 workers"),
    (dict(workers=3, ulysses_degree=3), "workers: more workers (3) than devices (2: cpu, cpu)"),
    (dict(devices="cpu, cuda:0"), "devices: 'cpu, cuda:0' mixes CPU and GPU workers"),
    (dict(devices="tpu"), "devices: 'tpu' is not a device list"),
])
def test_bad_plans_are_refused_by_name(comfyui, tiny_models, parallel_experts, plan, words):
    message = P.failed_at_run(comfyui, with_plan(two_heads(parallel_experts, tiny_models), **plan))
    assert words in message, message


def test_without_ray_the_node_says_how_to_install_it(comfyui, tiny_models, parallel_experts, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    message = P.failed_at_run(comfyui, with_plan(two_heads(parallel_experts, tiny_models)))
    assert "the parallel plan needs Ray and yunchang (ray is not installed)" in message and "pip install" in message


def test_a_model_patch_the_workers_cannot_rebuild_is_refused_by_name(comfyui, tiny_models, parallel_experts,
                                                                     probe_nodes):
    high, low = parallel_experts[("t2v", "high")], parallel_experts[("t2v", "low")]
    prompt = P.our_prompt(P.on_each_expert(P.bridged(high, low), "Wan22TestReplaceBlock", block=0),
                          P.text_folder(tiny_models), **RUN)
    message = P.failed_at_run(comfyui, with_plan(prompt))
    assert "carries model patches the workers cannot rebuild (transformer option patches_replace" in message, message
    assert not probe_nodes["replace"], "nothing may run before the refusal"


def test_an_attention_override_that_puts_itself_back_on_top_each_step_is_refused_by_name(comfyui, tiny_models,
                                                                                        parallel_experts, probe_nodes):
    """A newer ComfyUI's sparse attention node re-installs its override on top at every step (ON_PREPARE_STATE),
    where the split's own attention would have to wrap it: the plan refuses the callback by name before any worker
    runs, and the same graph without the plan runs, the override put back each step."""
    high, low = parallel_experts[("t2v", "high")], parallel_experts[("t2v", "low")]
    prompt = P.our_prompt(P.on_each_expert(P.bridged(high, low), "Wan22TestReinstallingAttention"),
                          P.text_folder(tiny_models), **RUN)
    message = P.failed_at_run(comfyui, with_plan(prompt))
    assert "carries model patches the workers cannot rebuild" in message, message
    assert "on_prepare_state callback block_sparse_attention" in message, message
    assert not probe_nodes["reinstalled"], "nothing may run before the refusal"
    P.run_ok(comfyui, prompt)
    assert probe_nodes["reinstalled"]


def test_an_attention_override_on_the_model_is_the_splits_inner_attention_equal_to_one_process(
        comfyui, tiny_models, parallel_experts, probe_nodes, tmp_path):
    """The override (one that scales each block's attention differently, as sage or flash attention nodes put
    theirs) is sent to the workers and runs inside the sequence split: self-attention on each rank's share of
    the heads, cross-attention with every head; the result equals one process with the same override."""
    high, low = parallel_experts[("t2v", "high")], parallel_experts[("t2v", "low")]
    record = tmp_path / "calls.txt"
    prompt = P.our_prompt(P.on_each_expert(P.bridged(high, low), "Wan22TestRecordAttention", record_to=str(record)),
                          P.text_folder(tiny_models), **{**RUN, "cfg": (1.0, 1.0)})
    P.run_ok(comfyui, P.our_prompt(P.bridged(high, low), P.text_folder(tiny_models), **{**RUN, "cfg": (1.0, 1.0)}))
    plain = P.latent_of(comfyui, "5")
    P.run_ok(comfyui, prompt)
    alone = P.latent_of(comfyui, "5")
    assert not near_one_process(alone, plain), "the override should change the result"
    record.unlink()
    P.run_ok(comfyui, with_plan(prompt))
    assert near_one_process(P.latent_of(comfyui, "5"), alone)
    workers = comfyui.worker_pids()
    calls = [line.split() for line in record.read_text().splitlines()]
    assert {int(pid) for pid, _, _ in calls} == set(workers)  # run by the workers, none by this process
    heads = {(int(pid), int(h)) for pid, h, _ in calls}
    assert heads == {(pid, h) for pid in workers for h in (1, 2)}  # self-attention on 1 of the 2 heads each


@pytest.mark.parametrize("key", ["control", "hooks", "gligen"])
def test_conditioning_that_carries_models_of_its_own_is_refused_by_name(comfyui, key):
    """ControlNet, hooks and GLIGEN put objects of their own into a prompt's conditioning: no worker could
    rebuild them, so the run is refused before any worker starts."""
    from types import SimpleNamespace

    parallel = comfyui.pack("nodes.parallel.sampling")
    errors = comfyui.pack("nodes.core.errors")
    plan = comfyui.pack("nodes.core.parallel").make_plan(workers=2, devices="cpu, cpu", ulysses_degree=2,
                                                         cpu_threads=1, gpus=0, cpus=2)
    text = torch.zeros(1, 512, 4096)
    with pytest.raises(errors.Wan22InputError) as refused:
        parallel.sample_on_workers(SimpleNamespace(parallel_plan=plan), None, None, [[text, {}]],
                                   [[text, {key: object()}]], {"samples": torch.zeros(1, 16, 2, 4, 4)}, 0,
                                   {"high": 1.0, "low": 1.0})
    assert str(refused.value).startswith(f"negative: carries {key} (a ControlNet, hooks or GLIGEN node)")


def test_every_field_of_a_model_clone_is_named_in_the_workers_rebuild_table(comfyui):
    """A ModelPatcher clone's fields are exactly those parallel/rebuild.py names (rebuilt by the loader, sent,
    or refused when set): a field a later ComfyUI adds fails here, instead of workers silently differing from
    one process; a name the table keeps for a field that is gone fails too."""
    import comfy.model_patcher

    rebuild = comfyui.pack("nodes.parallel.rebuild")
    named = [field for fields in rebuild.FIELDS.values() for field in fields]
    assert len(named) == len(set(named)), "a field is named twice"
    clone = comfy.model_patcher.ModelPatcher(torch.nn.Linear(2, 2), load_device=torch.device("cpu"),
                                             offload_device=torch.device("cpu")).clone()
    assert set(vars(clone)) - set(named) == set(), "fields the workers' rebuild does not account for"
    assert set(named) - set(vars(clone)) == set(), "names for fields a ModelPatcher no longer has"


def test_an_attachment_on_the_model_is_refused_by_name_but_a_lora_header_is_sent(comfyui):
    import comfy.model_patcher

    rebuild = comfyui.pack("nodes.parallel.rebuild")
    model = comfy.model_patcher.ModelPatcher(torch.nn.Linear(2, 2), load_device=torch.device("cpu"),
                                             offload_device=torch.device("cpu"))
    assert rebuild.unrebuildable(model.clone()) == []
    model.set_attachments("lora_metadata", {"format": "pt"})  # every LoRA loader attaches its file's header
    assert rebuild.unrebuildable(model) == []
    rebuilt = rebuild.rebuilt(model, {"patches": {}, "patches_uuid": model.patches_uuid,
                                      "attachments": rebuild.sent_attachments(model)})
    assert rebuilt.get_attachment("lora_metadata") == {"format": "pt"}
    model.attachments["probe"] = object()
    assert rebuild.unrebuildable(model) == ["attachment probe"]


def test_dmd_on_a_sequence_the_workers_cut_is_refused_by_name_before_any_worker_starts(comfyui, tiny_models,
                                                                                      parallel_experts):
    prompt = with_plan(two_heads(parallel_experts, tiny_models, cfg=(1.0, 1.0),
                                 cache={**P.CACHING, "calibrator": "dmd"}))
    before = comfyui.worker_pids()  # a warm pool an earlier test left, or none
    message = P.failed_at_run(comfyui, prompt)
    assert message.startswith("calibrator: dmd fits each prompt's whole hidden state") and "taylorseer" in message
    assert comfyui.worker_pids() == before  # refused before the run reached any worker
