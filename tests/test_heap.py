"""Freed memory is kept and reused: after a few training steps a step faults (almost) no pages in.

Counted with the kernel's minor page faults (``getrusage``), in a fresh process so the setting
and the count are the process's own. Without the setting glibc faults hundreds to thousands of
pages into every step of this one (it gives the freed top of the heap back to the OS each time);
with it most steps fault none. Some steps still fault a few hundred: the heap's high-water mark
grows now and then, and on a loaded machine the kernel takes code pages of the process back and
faults them in again (a CI run saw half the steady steps do so), so the test asks for several
fault-free steps, not for a typical one.
"""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys

import pytest

from nsacdrive.common.heap import keep_freed_memory

STEP_COUNT = 14
STEPS = """
import json, resource, sys, torch
from nsacdrive.common.heap import keep_freed_memory
from nsacdrive.controllers.model_config import ModelConfig
from nsacdrive.controllers.ood_proxies import make_perturbation
from nsacdrive.controllers.registry import build_controller
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
torch.set_num_threads(1)
torch.manual_seed(0)
controller = build_controller(ModelConfig(model="nsac")).train()
optimizer = torch.optim.AdamW(controller.parameters(), 1e-3)
frames, times = torch.rand(8, 4, 3, 84, 96), torch.tensor([[-0.12, -0.08, -0.04, 0.0]]).repeat(8, 1)
perturb = make_perturbation("noise", torch.Generator().manual_seed(0), 0.0, 0.2, 0.25)
faults = []
for _ in range(STEP_COUNT):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    loss = controller.training_loss(frames, times, torch.rand(8, 3), perturb=perturb)["total"]
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults}))
"""


def step_faults(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", STEPS.replace("STEP_COUNT", str(STEP_COUNT)), mode], capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None, reason="glibc's malloc only")
def test_training_steps_reuse_their_memory_once_it_is_kept():
    kept = step_faults("keep")
    assert kept["applied"] is True
    steady = kept["faults"][4:]  # after warm-up: the heap has reached the step's high-water mark
    assert sum(count <= 16 for count in steady) >= 3, kept["faults"]  # without the setting no step gets under ~400


LARGE_BLOCKS = """
import json, resource, sys, numpy
from nsacdrive.common.heap import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
faults = []
for _ in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    numpy.ones(2**23)  # 64 MiB, made and freed: above the largest mmap threshold glibc accepts (32 MiB)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None, reason="glibc's malloc only")
@pytest.mark.parametrize("mode", ["keep", "default"])
def test_blocks_above_the_largest_mmap_threshold_are_kept_too(mode: str):
    """A 64 MiB array made again and again: glibc maps fresh pages for each (16,384 faults, or 32 and
    more with transparent huge pages) unless freed memory is kept; kept, the later ones reuse the
    first one's memory (a loaded machine may still fault a few code pages back in now and then)."""
    done = subprocess.run([sys.executable, "-c", LARGE_BLOCKS, mode], capture_output=True, text=True, check=True)
    later = json.loads(done.stdout)["faults"][2:]
    if mode == "keep":
        assert sum(count <= 16 for count in later) >= 3, later
    else:
        assert min(later) >= 32, later  # the control: without the setting every array faults its pages in


def test_keeping_freed_memory_is_set_once_per_process():
    assert keep_freed_memory() is keep_freed_memory()
