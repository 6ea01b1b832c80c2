"""The trained test beds' builder (devtools/testbed/), on a quick small version: deterministic for a config,
keyed by what decides the weights, its training-only attention shortcut exact, and its template fit a real
measure on every bed's data world (textures, pans and sizes included)."""

import dataclasses
import hashlib
import importlib
import json
import os
import shutil

import pytest
import torch

from devtools import testbed
from devtools.testbed.world import ANCHOR_REACH


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


def test_the_cache_key_is_the_content_of_what_decides_the_weights_and_nothing_else(tmp_path):
    """A change in world.py or train.py trains every bed anew; the roles, the evaluation, the cache's own code do not
    (moving them between modules keeps the beds)."""
    copies = []
    for source in testbed.WEIGHT_SOURCES:
        copies.append(tmp_path / os.path.basename(source))
        shutil.copy(source, copies[-1])
    assert testbed.weights_key(tuple(map(str, copies))) == testbed.weights_key()
    assert {os.path.basename(p) for p in testbed.WEIGHT_SOURCES} == {"world.py", "train.py"}
    for copy in copies:
        text = copy.read_text(encoding="utf-8")
        copy.write_text(text + "\n# changed\n", encoding="utf-8")
        assert testbed.weights_key(tuple(map(str, copies))) != testbed.weights_key(), copy.name
        copy.write_text(text, encoding="utf-8")


def test_a_cached_bed_of_another_config_is_not_taken_and_its_role_is_todays(monkeypatch, tmp_path):
    monkeypatch.setenv("WAN22_TESTBED_CACHE", str(tmp_path))
    folder = testbed.bed_folder("tuning")
    os.makedirs(folder)
    log = {"name": "tuning", "role": "held-out", "config": dataclasses.asdict(testbed.BEDS["tuning"])}
    with open(os.path.join(folder, "bed.json"), "w", encoding="utf-8") as f:
        json.dump(log, f)
    assert testbed.build("tuning").role == testbed.ROLES["tuning"] == "tuning"
    log["config"]["seed"] = 99
    with open(os.path.join(folder, "bed.json"), "w", encoding="utf-8") as f:
        json.dump(log, f)
    trained = []
    builder = importlib.import_module("devtools.testbed.build")
    monkeypatch.setattr(builder, "train_both", lambda config, folder: trained.append(config) or 1 / 0)
    with pytest.raises(ZeroDivisionError):
        testbed.build("tuning")
    assert trained == [testbed.BEDS["tuning"]]


def test_the_cache_lives_outside_the_clone_one_folder_per_bed(monkeypatch, tmp_path):
    monkeypatch.delenv("WAN22_TESTBED_CACHE", raising=False)
    assert not testbed.bed_folder().startswith(testbed.ROOT)
    monkeypatch.setenv("WAN22_TESTBED_CACHE", str(tmp_path))
    assert testbed.bed_folder() == str(tmp_path / testbed.weights_key() / testbed.TUNING)
    assert len({testbed.bed_folder(name) for name in testbed.BEDS}) == len(testbed.BEDS)


def test_the_tuning_bed_chooses_and_every_bed_says_whether_it_has_tuned():
    assert testbed.ROLES[testbed.TUNING] == "tuning"
    assert {testbed.ROLES[name] for name in testbed.BEDS} <= {"tuning", "held-out"}
    assert {testbed.ROLES[name] for name in testbed.FAMILY} == {"family"}
    assert len(testbed.BEDS) >= 3
    configs = list(testbed.BEDS.values())
    for field in ("num_layers", "heads", "shapes", "seed"):
        assert len({getattr(c, field) for c in configs}) > 1, field
    assert any(len(c.sizes) > 1 for c in configs)  # calibrating small and running large can be measured
    assert all(6 <= c.num_layers <= 16 for c in configs)  # the README's "6 to 16 layers"
    held_out = [testbed.BEDS[name] for name in testbed.BEDS if testbed.ROLES[name] == "held-out"]
    assert len(held_out) >= 2  # built after the error criterion's design was frozen, from data unlike the others'
    assert all(c.palette or c.objects > 1 for c in held_out)


def test_a_config_comes_back_from_its_json():
    for config in testbed.BEDS.values():
        assert testbed.BedConfig.from_dict(json.loads(json.dumps(dataclasses.asdict(config)))) == config


def test_each_bed_trains_on_its_own_data_deterministically():
    """A training batch of every bed, at each of its sizes, twice from the same generator: equal; the beds' worlds
    differ; a VACE bed's batch carries each sample's control (the object's track), the others none."""
    batches = {}
    for name, config in {**testbed.BEDS, **testbed.FAMILY}.items():
        world = testbed.World(config)
        for size in config.sizes:
            first, second = (testbed.flow_batch(world, "low", 2, torch.Generator().manual_seed(4), 0.1, size)
                             for _ in range(2))
            assert all(torch.equal(a, b) for a, b in zip(first[:4], second[:4]))
            assert first[0].shape == (2, config.channels, *(size[0], size[1], size[1]))
            if not config.vace:
                assert first[4] is None and second[4] is None
                continue
            assert torch.equal(first[4], second[4])
            assert first[4].shape == (2, testbed.VACE_CHANNELS, *(size[0], size[1], size[1]))
            _x0, classes, controls = world.sample(2, torch.Generator().manual_seed(4), size, controls=True)
            fit = world.fit(controls[0, 16:32])  # the reactive frames: the object alone, on its track
            assert fit["class"] == classes[0] and fit["rel_l2"] < 1e-6
        batches[name] = testbed.flow_batch(world, "low", 2, torch.Generator().manual_seed(4), 0.1)[3]
    names = list(batches)
    assert all(not torch.equal(batches[a], batches[b]) for a in names for b in names if a < b
               and batches[a].shape == batches[b].shape)


def test_the_short_context_attention_equals_attention_over_all_512_rows():
    from diffusers import WanTransformer3DModel

    world = testbed.World(testbed.QUICK)
    torch.manual_seed(0)
    model = WanTransformer3DModel(**testbed.model_config(testbed.QUICK)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # the default init leaves the modulation and head near zero
            if "scale_shift_table" in name or name.startswith("proj_out"):
                p.normal_(0.0, 0.2)
    x, t, short, _, _ = testbed.flow_batch(world, "low", 4, torch.Generator().manual_seed(3), dropout=0.5)
    full = torch.zeros(4, testbed.TEXT_ROWS, testbed.TEXT_WIDTH)
    full[:, :testbed.PROMPT_TOKENS] = short[:, :testbed.PROMPT_TOKENS]
    with torch.no_grad():
        reference = model(x, t, full, return_dict=False)[0]
        for block in model.blocks:
            block.attn2.set_processor(testbed.ShortContextAttention(testbed.TEXT_ROWS - testbed.PROMPT_TOKENS))
        shortcut = model(x, t, short, return_dict=False)[0]
    assert reference.abs().max() > 0.1
    assert torch.allclose(shortcut, reference, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", [*testbed.BEDS, *testbed.FAMILY])
def test_clean_data_fits_its_own_template_and_noise_fits_none(name):
    config = testbed.config_of(name)
    world = testbed.World(config)
    for size in config.sizes:  # four samples at the first size, two at the larger ones (where a fit costs most)
        data, classes = world.sample(4 if size == config.sizes[0] else 2, torch.Generator().manual_seed(5), size)
        fits = [world.fit(x) for x in data]
        assert all(f["rel_l2"] < 0.15 for f in fits)  # the noise the data carries: about 0.05
        assert [f["class"] for f in fits] == classes.tolist()
        noise = world.fit(torch.randn(data[0].shape, generator=torch.Generator().manual_seed(6)))
        assert noise["rel_l2"] > 0.95


# What the beds built before the new data options drew (world.py's defaults): a change that moves a draw of theirs
# would silently make their cached weights another world's. A SHA-256 prefix of three samples and their classes.
DRAWN_BEFORE = {"tuning": "9c71dc4c6b05f1d9", "deep": "cf8791b13cbae399", "wide": "20a1936556135eae",
                "vace": "0d95d1a17e83ab27", "ti2v": "f03216f35ef7d5f9"}


@pytest.mark.parametrize("name", DRAWN_BEFORE)
def test_the_beds_built_before_the_new_data_options_draw_what_they_drew(name):
    config = testbed.config_of(name)
    x, classes, *_ = testbed.World(config).sample(3, torch.Generator().manual_seed(5), controls=config.vace)
    drawn = hashlib.sha256(x.numpy().tobytes() + classes.numpy().tobytes()).hexdigest()[:16]
    assert drawn == DRAWN_BEFORE[name]


def test_a_palette_gives_each_class_its_own_colour_and_the_negative_none():
    """A world with a palette: one colour a class, equal in norm and angle, their mean zero (what the negative
    prompt's stream is trained towards shows no object colour), and each sample's object in its class's colour."""
    world = testbed.World(testbed.config_of("follow"))
    palette = world.palette.double()
    assert palette.shape == (len(world.classes), testbed.CHANNELS)
    assert palette.mean(0).abs().max() < 1e-6
    gram = palette @ palette.T
    assert torch.allclose(gram.diagonal(), torch.full((8,), 16.0, dtype=gram.dtype))
    off = gram[~torch.eye(8, dtype=torch.bool)]
    assert torch.allclose(off, off[0].expand_as(off)) and off[0] < 0  # a simplex: every pair at one angle
    for cls in range(len(world.classes)):
        y, x = world.starts(cls)[0]
        obj = world.basis(cls, y, x)[0]
        loading = obj.flatten(1) @ world.pattern(cls, y, x).flatten() / world.pattern(cls, y, x).square().sum()
        assert torch.allclose(loading, world.palette[cls], atol=1e-5)


def test_an_anchored_class_starts_near_a_place_of_its_own():
    """Anchored, each class's starts lie within ANCHOR_REACH of one another (one place each), every one also a
    start of the same world unanchored; the classes' places differ."""
    config = testbed.config_of("follow")
    anchored, free = testbed.World(config), testbed.World(dataclasses.replace(config, anchored=False))
    places = set()
    for cls in range(len(anchored.classes)):
        starts = anchored.starts(cls)
        assert 1 <= len(starts) <= (2 * ANCHOR_REACH + 1) ** 2 and set(starts) <= set(free.starts(cls))
        assert all(abs(a - b) <= 2 * ANCHOR_REACH for s in starts for t in starts for a, b in zip(s, t))
        places.add(starts[0])
    assert len(places) > 1
    one_start = testbed.World(dataclasses.replace(config, anchor_reach=0))  # the prompt fixes the path
    anchors = set()
    for cls in range(len(anchored.classes)):
        (start,) = one_start.starts(cls)
        assert start in anchored.starts(cls)  # the anchor itself
        anchors.add(start)
    assert len(anchors) > 1


def test_several_objects_are_found_where_they_are():
    """A two-object world's fit finds both objects of a template built from known starts, in either order."""
    config = testbed.config_of("crowd")
    world = testbed.World(config)
    frames, side = config.measured
    cls = 5
    starts = world.starts(cls, frames, side)
    first, second = starts[1], starts[-2]
    basis = world.basis(cls, *first, frames, side, pan=3, more=(second,))
    latent = (torch.tensor([0.9, 0.6, 0.2, 0.3, -0.4, 0.5])[:, None, None, None, None] * basis).sum(0)
    fit = world.fit(latent)
    assert fit["class"] == cls and fit["pan"] == 3 and fit["rel_l2"] < 1e-4
    assert sorted([tuple(fit["start"]), *map(tuple, fit["more"])]) == sorted([first, second])
