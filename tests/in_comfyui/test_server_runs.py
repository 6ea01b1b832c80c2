"""Whole runs through real ComfyUI servers over HTTP: interruption and repeatability."""

import torch

from devtools.comfy_server import run_and_load

from .prompts import expert_files, loader, our_prompt, text_folder


def prompt_for(tiny, seed, prefix, steps=8, **kw):
    return our_prompt(loader(*expert_files(tiny)), text_folder(tiny), steps=steps, seed=seed,
                      save_latent_prefix=f"latents/{prefix}", **kw)


def test_seeds_a_b_a_on_one_server_give_bit_identical_a_results(tiny_models_server, tiny_models):
    a1, _ = run_and_load(tiny_models_server, prompt_for(tiny_models, 101, "seed_a1"))
    b, _ = run_and_load(tiny_models_server, prompt_for(tiny_models, 202, "seed_b"))
    a2, _ = run_and_load(tiny_models_server, prompt_for(tiny_models, 101, "seed_a2"))
    assert torch.equal(a1, a2) and not torch.equal(a1, b)


def test_an_interrupted_run_leaves_the_next_prompt_as_on_a_fresh_server(tiny_models_server, tiny_models, request):
    long_run = prompt_for(tiny_models, 7, "interrupted", steps=300, width=256, height=256, length=9)
    prompt_id, messages = tiny_models_server.run_and_interrupt(long_run, node_id="5", at_step=3)
    kinds = [m["type"] for m in messages]
    assert "execution_interrupted" in kinds and "execution_success" not in kinds
    progress = [m["data"]["value"] for m in messages if m["type"] == "progress" and m["data"]["node"] == "5"]
    assert progress and max(progress) < 300  # stopped in the middle
    # The websocket message can arrive before the history entry is written: wait for the entry.
    history = tiny_models_server.wait(prompt_id, timeout=600)
    assert history["status"]["status_str"] == "error"

    after, _ = run_and_load(tiny_models_server, prompt_for(tiny_models, 8, "after_interrupt"))
    fresh = request.getfixturevalue("fresh_tiny_models_server")  # started only now: it never saw the interrupt
    assert torch.equal(after, run_and_load(fresh, prompt_for(tiny_models, 8, "after_interrupt"))[0])


def test_an_interrupted_cached_run_then_the_same_prompt_equals_it_on_a_fresh_server(tiny_models_server, tiny_models,
                                                                                    request):
    steps = 120
    prompt = prompt_for(tiny_models, 17, "cached_interrupted", steps=steps, width=256, height=256, length=9,
                        cache={})
    _, messages = tiny_models_server.run_and_interrupt(prompt, node_id="5", at_step=30)
    progress = [m["data"]["value"] for m in messages if m["type"] == "progress" and m["data"]["node"] == "5"]
    assert "execution_interrupted" in [m["type"] for m in messages] and max(progress) < steps
    again = prompt_for(tiny_models, 17, "cached_again", steps=steps, width=256, height=256, length=9, cache={})
    latent, _ = run_and_load(tiny_models_server, again)
    fresh = request.getfixturevalue("fresh_tiny_models_server")
    assert torch.equal(latent, run_and_load(fresh, again)[0])
