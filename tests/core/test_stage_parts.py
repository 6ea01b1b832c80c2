"""A cached stage's parts: installed in order, every one removed in the reverse order, also after an error (no
ComfyUI)."""

import pytest
import torch

from wan22_cachedit.nodes import stage_parts


class Recording(stage_parts.Part):
    def __init__(self, name, log, fail=None, held=None):
        self.name, self.log, self.fail, self._held = name, log, fail, held

    def install(self):
        self.log.append(("install", self.name))
        if self.fail == "install":
            raise RuntimeError(f"{self.name} install")

    def remove(self):
        self.log.append(("remove", self.name))
        if self.fail == "remove":
            raise RuntimeError(f"{self.name} remove")

    def held(self):
        return self._held or stage_parts.NOTHING_HELD


def test_parts_come_off_in_reverse_order_and_a_failing_install_or_removal_stops_none_of_the_others():
    log, installed = [], []
    parts = [Recording("a", log), Recording("b", log, fail="install"), Recording("c", log)]
    with pytest.raises(RuntimeError, match="b install"):
        stage_parts.install_all(parts, installed)
    errors = []
    stage_parts.remove_all(installed, errors.append)
    # c was never installed; b, half installed, comes off with a
    assert log == [("install", "a"), ("install", "b"), ("remove", "b"), ("remove", "a")]

    log, installed = [], []
    parts = [Recording("a", log), Recording("b", log, fail="remove"), Recording("c", log)]
    stage_parts.install_all(parts, installed)
    stage_parts.remove_all(installed, errors.append)
    assert log[3:] == [("remove", "c"), ("remove", "b"), ("remove", "a")]
    assert [str(e) for e in errors] == ["b remove"]


def test_what_the_parts_hold_is_added_up_over_their_devices():
    parts = [Recording("a", [], held={"bytes": 10, "devices": ["cpu"]}), Recording("b", []),
             Recording("c", [], held={"bytes": 5, "devices": ["cuda:0", "cpu"]})]
    assert stage_parts.held_together(parts) == {"bytes": 15, "devices": ["cpu", "cuda:0"]}
    assert stage_parts.held_together([]) == {"bytes": 0, "devices": []}


def test_the_block_count_counts_every_block_forward_while_installed_only():
    blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)])
    count = stage_parts.BlockCount(blocks)
    count.install()
    for block in blocks[:2]:
        block(torch.zeros(1, 2))
    count.remove()
    blocks[2](torch.zeros(1, 2))
    assert count.count == 2 and all(not block._forward_hooks for block in blocks)
