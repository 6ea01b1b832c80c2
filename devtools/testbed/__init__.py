"""The trained test beds: tiny two-expert Wan2.2 models that denoise, for every quality figure the pack states.

Random-weight experts prove plumbing and equality, but they do not denoise, so a stale cached residual costs
them little and says nothing about what a cache costs a real run. This package trains pairs of tiny Wan2.2
experts (head width 128 like the real ones) on a synthetic world of moving objects, builds each bed once per
machine into a cache outside the clone, and logs what each generates through ComfyUI's own graph. Its rooms:

    world.py     the data world and a bed's config (BedConfig, World)        } these two decide the weights:
    train.py     training one expert by flow matching, deterministically      } they are the cache key
    beds.py      which beds exist (BEDS, FAMILY, QUICKS) and their roles
    build.py     the cache: train both experts side by side, write, evaluate, log (bed.json)
    evaluate.py  what a bed generates through ComfyUI's two-KSamplerAdvanced graph: template fit, class right
    __main__.py  the command line

The beds differ where real models differ: depth, heads, the data (objects, motions, a textured background, a
camera pan), the latent sizes trained at and the training's length. `tuning` chooses the pack's defaults; the
roles say which beds have tuned anything (docs/quality.md). The family's beds (FAMILY) are other Wan2.2 models: a
VACE-Fun pair trained to put the object where a control puts it, and a TI2V-5B stand-in (one transformer over
every noise level on a 48-channel latent). They are tiny and synthetic: they say how a cache's error behaves on
models that denoise, not how a real Wan2.2 video looks.

    .venv/bin/python -m devtools.testbed [--bed tuning deep wide follow crowd path vace ti2v] [--force] [--quick]
"""

from devtools.testbed.beds import BEDS, FAMILY, QUICK, QUICKS, ROLES, TUNING, config_of
from devtools.testbed.build import ROOT, WEIGHT_SOURCES, Bed, bed_folder, build, cache_root, load_bed, weights_key
from devtools.testbed.evaluate import GENERATION_RUN, control_start, evaluate
from devtools.testbed.train import (ShortContextAttention, draw_s, expert_model, flow_batch, model_config, predict,
                                    short_contexts, train_expert, transformer_class)
from devtools.testbed.world import (BOUNDARY, CHANNELS, FRAMES, PROMPT_TOKENS, SINGLE, SINGLE_CHANNELS, SIZE,
                                    TEXT_ROWS, TEXT_WIDTH, VACE_CHANNELS, BedConfig, World)

__all__ = ["BEDS", "BOUNDARY", "CHANNELS", "FAMILY", "FRAMES", "GENERATION_RUN", "PROMPT_TOKENS", "QUICK", "QUICKS",
           "ROLES", "ROOT", "SINGLE", "SINGLE_CHANNELS", "SIZE", "TEXT_ROWS", "TEXT_WIDTH", "TUNING", "VACE_CHANNELS",
           "WEIGHT_SOURCES", "Bed", "BedConfig", "ShortContextAttention", "World", "bed_folder", "build", "cache_root",
           "config_of", "control_start", "draw_s", "evaluate", "expert_model", "flow_batch", "load_bed",
           "model_config", "predict", "short_contexts", "train_expert", "transformer_class", "weights_key"]
