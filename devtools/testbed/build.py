"""Building a bed once per machine: trained (the experts side by side, one process and one thread each), written as
ComfyUI single files, evaluated (evaluate.py), and cached outside the clone
(~/.cache/wan22-cachedit/testbed/<key>/<bed>, or $WAN22_TESTBED_CACHE). The key is the content of the modules that
decide the weights (world.py, train.py); a cached bed whose config differs from its name's is trained anew."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import torch

from devtools.testbed.beds import ROLES, TUNING, config_of
from devtools.testbed.evaluate import evaluate
from devtools.testbed.train import expert_model
from devtools.testbed.world import BedConfig, World

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WEIGHT_SOURCES = tuple(os.path.join(HERE, f) for f in ("world.py", "train.py"))


def weights_key(paths: tuple[str, ...] = WEIGHT_SOURCES) -> str:
    """The beds' cache key: the content of the modules that decide the weights (a change there trains every bed
    anew; the beds' roles, the evaluation and this module are not in it)."""
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def cache_root() -> str:
    return os.environ.get("WAN22_TESTBED_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "wan22-cachedit",
                                                                  "testbed")


def bed_folder(name: str = TUNING, key: str | None = None) -> str:
    """Where bed `name` of these weight sources (or of `key`) is cached."""
    return os.path.join(cache_root(), key or weights_key(), name)


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Bed:
    """A built bed: its name, its folder, the two experts' files and its log."""

    folder: str
    log: dict

    @property
    def name(self) -> str:
        return self.log["name"]

    @property
    def config(self) -> BedConfig:
        return BedConfig.from_dict(self.log["config"])

    @property
    def role(self) -> str:
        return self.log["role"]

    @property
    def files(self) -> dict:
        return {role: os.path.join(self.folder, f"{role}.safetensors") for role in self.config.roles}


def load_bed(folder: str) -> Bed | None:
    path = os.path.join(folder, "bed.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return Bed(folder, json.load(f))


def build(name: str = TUNING, force: bool = False, folder: str | None = None, log=print) -> Bed:
    """Bed `name`, from the cache when it was built on this machine before with this config, else trained now (the two
    experts side by side, one process and one thread each), written (training.json), then evaluated through
    ComfyUI (bed.json). Trained experts whose evaluation did not finish are evaluated, not trained again."""
    config = config_of(name)
    role = "quick" if name.startswith("quick") else ROLES[name]  # a label, not in the key: today's, not the cached
    folder = folder or bed_folder(name)
    if not force and (bed := load_bed(folder)) is not None and bed.config == config:
        bed.log["role"] = role
        return bed
    os.makedirs(folder, exist_ok=True)
    trained = os.path.join(folder, "training.json")
    if not force and os.path.exists(trained):
        with open(trained, encoding="utf-8") as f:
            force = BedConfig.from_dict(json.load(f)["config"]) != config  # another config under this name
    if force or not os.path.exists(trained):
        log(f"[testbed] training bed {name!r} ({config.num_layers} layers, {config.heads} heads, "
            f"at most {config.max_steps} steps): {folder}")
        bed_log = train_both(config, folder)
        with open(trained, "w", encoding="utf-8") as f:
            json.dump(bed_log, f, indent=2)
    with open(trained, encoding="utf-8") as f:
        bed_log = json.load(f)
    bed_log.update(name=name, role=role)
    bed = Bed(folder, bed_log)
    bed_log["generation"] = evaluate(bed, log=log)
    with open(os.path.join(folder, "bed.json"), "w", encoding="utf-8") as f:
        json.dump(bed_log, f, indent=2)
    log(f"[testbed] bed {name!r} built in {bed_log['training_wall_s']:.0f} s of training: {folder}")
    return bed


def train_both(config: BedConfig, folder: str) -> dict:
    """Trains the two experts in two processes of one thread each (a single transformer in one) and writes them as
    ComfyUI single files."""
    from devtools.tiny_wan import write_single_file

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="wan22-testbed-") as tmp:
        procs = {}
        for role in config.roles:
            out = os.path.join(tmp, role)
            procs[role] = subprocess.Popen([sys.executable, "-m", "devtools.testbed", "--train-one", role, "--out", out,
                                            "--config", json.dumps(asdict(config))], cwd=ROOT)
        for role, proc in procs.items():
            if proc.wait() != 0:
                raise RuntimeError(f"training the {role}-noise expert failed (exit {proc.returncode})")
        training = {}
        for role in config.roles:
            state = torch.load(os.path.join(tmp, role, "weights.pt"))
            with open(os.path.join(tmp, role, "log.json"), encoding="utf-8") as f:
                training[role] = json.load(f)
            write_single_file(expert_model(config, state), os.path.join(folder, f"{role}.safetensors"), "fp32")
    return {"key": os.path.basename(os.path.dirname(folder)), "config": asdict(config),
            "classes": World(config).classes, "training_wall_s": round(time.perf_counter() - started, 1),
            "training": training,
            "sha256": {role: sha256_of(os.path.join(folder, f"{role}.safetensors")) for role in config.roles},
            "torch": torch.__version__, "built": time.strftime("%Y-%m-%d %H:%M:%S")}
