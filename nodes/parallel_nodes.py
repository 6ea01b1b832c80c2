"""Wan2.2 Parallel Plan: puts a parallel plan on a new experts handle; the sampler then runs each stage on the
plan's workers, the token sequence split across them (Ulysses sequence parallelism) or, at CFG above 1, each
evaluation's two prompts (CFG parallel)."""

from __future__ import annotations

import os

from comfy_api.latest import io

from .core import parallel as core
from .core.errors import Wan22InputError
from .types import CATEGORY, ExpertsType, linked_given, linked_only


def gpus_here() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cpu_cores() -> int:
    """The bound on CPU workers and threads (tests on a small machine replace it to start more)."""
    return os.cpu_count() or 1


class Wan22ParallelPlan(io.ComfyNode):
    # Inputs added after workflows were saved with this node, and the value such a workflow runs with (an API
    # prompt without the input gets it from execute's default; a saved UI workflow from the canvas, which reads
    # this through routes.added_inputs). Their schema default is for new nodes.
    ADDED_INPUTS = {"split": core.SAVED_SPLIT}

    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="Wan22ParallelPlan",
            display_name="Wan2.2 Parallel Plan (Ray, Ulysses)",
            category=CATEGORY,
            description="Runs the sampler's stages on several workers (Ray actors, one per device, in one "
                        "torch.distributed group), each expert's token sequence split across them with Ulysses "
                        "attention, and at CFG above 1 each evaluation's two prompts (split). Each worker loads the "
                        "experts itself from the same files and keeps them loaded "
                        "between runs of this plan. Needs Ray and yunchang: " + core.INSTALL + ".",
            inputs=[
                ExpertsType.Input("experts", tooltip="The experts (with their LoRAs and Cache-DiT plan, if any); the "
                                                     "handle this node received still runs in this process."),
                io.Int.Input("workers", default=2, min=2, max=core.MAX_WORKERS,
                             tooltip="How many workers (processes, one per device) share each run."),
                io.String.Input("devices", default=core.AUTO,
                                tooltip="'auto': this machine's GPUs (or its CPU when it has none), or a list such as "
                                        "'cuda:0, cuda:1'; 'cuda, cuda' lets the Ray cluster pick the GPUs (with "
                                        "RAY_ADDRESS set, on several machines); 'cpu, cpu' runs on the CPU (gloo)."),
                io.Int.Input("ulysses_degree", default=2, min=1, max=core.MAX_WORKERS,
                             tooltip="How many workers split each sequence at a stage that splits only its "
                                     "sequence: set it to the number of workers. Any count works (heads and tokens "
                                     "the workers do not divide are padded); at a CFG split each half of the "
                                     "workers splits its prompt's sequence."),
                io.Int.Input("cpu_threads", default=0, min=0, max=1024, advanced=True,
                             tooltip="Torch threads per CPU worker (at most this machine's cores); 0 shares the cores "
                                     "among the workers."),
                io.Combo.Input("split", options=list(core.SPLITS), default="auto", optional=True,
                               tooltip="How the workers share a stage. auto: 'cfg' at a stage whose CFG is above 1 "
                                       "when the workers are even in number, else 'ulysses'. cfg: each "
                                       "evaluation's positive and negative prompt on half of the workers (two "
                                       "workers: one each; four or more: each half also splits its prompt's "
                                       "sequence); a stage at CFG 1 has one prompt and splits its sequence. "
                                       "ulysses: each sequence split over every worker. Workflows saved before "
                                       "this input keep 'ulysses'."),
            ],
            outputs=[ExpertsType.Output(display_name="experts", tooltip="The same experts, with the plan: connect "
                                                                        "them to the sampler.")],
        )

    @classmethod
    def validate_inputs(cls, experts=None):
        return linked_only(experts=experts)

    @classmethod
    def execute(cls, experts, workers, devices, ulysses_degree, cpu_threads=0,
                split=core.SAVED_SPLIT) -> io.NodeOutput:
        linked_given(experts=experts)
        if experts.architecture.vace_layers:
            raise Wan22InputError("experts", "the experts are VACE-Fun, whose control stream the parallel plan does "
                                             "not split (it cuts the token sequence at the first block; VACE's "
                                             "blocks read the whole of it): run VACE without the Wan2.2 Parallel "
                                             "Plan node")
        plan = core.make_plan(workers=workers, devices=devices, ulysses_degree=ulysses_degree,
                              cpu_threads=cpu_threads, gpus=gpus_here(), cpus=cpu_cores(),
                              cluster=bool(os.environ.get("RAY_ADDRESS")), split=split)
        from .parallel.gate import ray_module

        ray_module()  # says how to install Ray when it is missing, before any run
        text = (f"{plan.workers} workers on {', '.join(plan.devices)} ({plan.backend}), split {plan.split}, "
                f"Ulysses degree {plan.ulysses_degree}")
        return io.NodeOutput(experts.replace(parallel_plan=plan), ui={"text": [text]})
