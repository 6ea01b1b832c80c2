"""The trained test bed's builder (devtools/testbed.py), on a quick small version: deterministic for a seed,
keyed by its script, its training-only attention shortcut exact, and its template fit a real measure."""

import dataclasses
import shutil

import pytest
import torch

from devtools import testbed


@pytest.fixture(scope="module")
def quick_experts():
    return [testbed.train_expert("low", testbed.QUICK, log=lambda *_: None)[0] for _ in range(2)]


def test_the_same_seed_trains_the_same_weights_bit_for_bit(quick_experts):
    first, second = quick_experts
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_another_seed_trains_other_weights(quick_experts):
    other, log = testbed.train_expert("low", dataclasses.replace(testbed.QUICK, seed=1), log=lambda *_: None)
    assert any(not torch.equal(other[k], quick_experts[0][k]) for k in other)
    assert log["steps"] == testbed.QUICK.max_steps and log["history"][0]["step"] == 0


def test_the_cache_key_is_the_scripts_content(tmp_path):
    copy = tmp_path / "testbed.py"
    shutil.copy(testbed.SCRIPT, copy)
    assert testbed.script_key(str(copy)) == testbed.script_key()
    copy.write_text(copy.read_text(encoding="utf-8") + "\n# changed\n", encoding="utf-8")
    assert testbed.script_key(str(copy)) != testbed.script_key()


def test_the_cache_lives_outside_the_clone(monkeypatch, tmp_path):
    monkeypatch.delenv("WAN22_TESTBED_CACHE", raising=False)
    assert not testbed.bed_folder().startswith(testbed.ROOT)
    monkeypatch.setenv("WAN22_TESTBED_CACHE", str(tmp_path))
    assert testbed.bed_folder() == str(tmp_path / testbed.script_key())


def test_the_short_context_attention_equals_attention_over_all_512_rows():
    from diffusers import WanTransformer3DModel

    world = testbed.World(0)
    torch.manual_seed(0)
    model = WanTransformer3DModel(**testbed.model_config(testbed.QUICK)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # the default init leaves the modulation and head near zero
            if "scale_shift_table" in name or name.startswith("proj_out"):
                p.normal_(0.0, 0.2)
    x, t, short, _ = testbed.flow_batch(world, "low", 4, torch.Generator().manual_seed(3), dropout=0.5)
    full = torch.zeros(4, testbed.TEXT_ROWS, testbed.TEXT_WIDTH)
    full[:, :testbed.PROMPT_TOKENS] = short[:, :testbed.PROMPT_TOKENS]
    with torch.no_grad():
        reference = model(x, t, full, return_dict=False)[0]
        for block in model.blocks:
            block.attn2.set_processor(testbed.ShortContextAttention(testbed.TEXT_ROWS - testbed.PROMPT_TOKENS))
        shortcut = model(x, t, short, return_dict=False)[0]
    assert reference.abs().max() > 0.1
    assert torch.allclose(shortcut, reference, rtol=1e-4, atol=1e-5)


def test_clean_data_fits_its_own_template_and_noise_fits_none():
    world = testbed.World(0)
    data, classes = world.sample(8, torch.Generator().manual_seed(5))
    fits = [world.fit(x) for x in data]
    assert all(f["rel_l2"] < 0.15 for f in fits)  # the texture the data carries: about 0.05
    assert [f["class"] for f in fits] == classes.tolist()
    noise = world.fit(torch.randn(testbed.CHANNELS, testbed.FRAMES, testbed.SIZE, testbed.SIZE,
                                  generator=torch.Generator().manual_seed(6)))
    assert noise["rel_l2"] > 0.95
