"""``StructureWatch``: whenever ``module_structure`` changes, ``unchanged()`` says so (it may also say "maybe"
where the structure is the same: the caller then compares in full)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from pullback.integrations.structure import StructureWatch, module_structure  # noqa: E402


def _model():
    m = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.1), nn.ReLU(), nn.Linear(4, 2))
    m.temperature = 2.0
    m.cache = torch.zeros(2)
    m.note = None
    return m


def _hook(*args):
    return None


MUTATIONS = {
    "eval mode": lambda m: m.eval(),
    "dropout rate": lambda m: setattr(m[1], "p", 0.5),
    "a setting": lambda m: setattr(m, "temperature", 3.0),
    "a tensor attribute set to None": lambda m: setattr(m, "cache", None),
    "None set to an array": lambda m: setattr(m, "note", np.ones(3)),
    "None set to a tuple of arrays": lambda m: setattr(m, "note", (np.ones(3), np.ones(3))),
    "a new attribute": lambda m: setattr(m[0], "scale", 2),
    "an attribute removed": lambda m: delattr(m, "temperature"),
    "an attribute removed and one added": lambda m: (delattr(m, "temperature"), setattr(m, "other", 1.0)),
    "a forward hook": lambda m: m[0].register_forward_hook(_hook),
    "a pre-hook": lambda m: m[2].register_forward_pre_hook(lambda mod, args: None),
    "an instance forward": lambda m: setattr(m[2], "forward", lambda x: x),
    "a layer replaced": lambda m: m.__setitem__(3, nn.Linear(4, 2)),
    "a layer appended": lambda m: m.append(nn.Tanh()),
    "a global hook": lambda m: nn.modules.module.register_module_forward_hook(_hook),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_every_change_of_the_structure_is_seen(name):
    m = _model()
    before, watch = module_structure(m), StructureWatch(m)
    assert watch.unchanged()
    handle = MUTATIONS[name](m)
    try:
        assert module_structure(m) != before
        assert not watch.unchanged()
    finally:
        if hasattr(handle, "remove"):
            handle.remove()


def test_a_hook_removed_is_seen():
    m = _model()
    handle = m[0].register_forward_hook(_hook)
    before, watch = module_structure(m), StructureWatch(m)
    handle.remove()
    assert module_structure(m) != before and not watch.unchanged()


def test_what_the_structure_ignores_keeps_the_watch_unchanged():
    # a tensor attribute rebound to another tensor, parameters' values, a setting set to an equal value
    m = _model()
    watch = StructureWatch(m)
    m.cache = torch.ones(2)
    with torch.no_grad():
        m[0].weight.add_(1.0)
    m.temperature = 2.0
    m.train()
    assert watch.unchanged()


def test_hooks_registered_elsewhere_keep_the_watch_unchanged_and_later_ones_are_seen():
    """The watch reads only the hook dicts in use while no hook is registered anywhere; a hook on a tensor or on
    another module moves that counter: the watch then reads them all, stays unchanged, and still sees a hook
    added to the module afterwards, or one it had removed."""
    m = _model()
    kept = m[3].register_forward_hook(_hook)
    watch = StructureWatch(m)
    other = nn.Linear(2, 2).register_forward_hook(_hook)
    t = torch.zeros(2, requires_grad=True)
    t.register_hook(lambda g: g)
    assert watch.unchanged() and watch.unchanged()
    kept.remove()
    assert not watch.unchanged()
    watch = StructureWatch(m)
    handle = m[0].register_forward_pre_hook(lambda mod, args: None)
    assert not watch.unchanged()
    handle.remove()
    other.remove()
    assert watch.unchanged()
