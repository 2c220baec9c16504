"""The one registry type every plugin kind uses: names in registration order, duplicates and
unknown names refused with what is allowed, plugins found by importing their package."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from attacks import ATTACKS
from clients.defences import DEFENCES
from fl_sim.executors import EXECUTORS
from flsim_plugins import Registry
from strategies.behaviours import BEHAVIOURS


class _Toy:
    name = "toy"


def test_names_in_order_lookup_and_refusals() -> None:
    toys: Registry[object] = Registry("toy", key="server.toy")
    toys.add("b", 1)
    toys.add("a", 2)
    assert toys.names() == ("b", "a") and list(toys) == ["b", "a"] and len(toys) == 2
    assert toys["a"] == 2 and toys.lookup("b") == 1 and "a" in toys
    with pytest.raises(ValueError, match="a toy named 'a' is registered already"):
        toys.add("a", 3)
    with pytest.raises(ValueError, match=r"server\.toy='c': allowed are b, a"):
        toys.lookup("c")


def test_decorators_keep_what_they_decorate() -> None:
    toys: Registry[object] = Registry("toy", key="toy")
    assert toys.instance(_Toy) is _Toy
    assert isinstance(toys["toy"], _Toy)
    assert toys.register("class")(_Toy) is _Toy and toys["class"] is _Toy


def test_discover_imports_every_module_of_a_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "toyplugins"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("one", "two"):
        (package / f"{name}.py").write_text(
            f"from tests.test_registry import FOUND\nFOUND.add({name!r}, {name!r})\n"
        )
    monkeypatch.syspath_prepend(str(tmp_path))
    import toyplugins  # type: ignore[import-not-found]

    try:
        FOUND.discover(toyplugins)
        assert set(FOUND) == {"one", "two"}
    finally:
        for name in [m for m in sys.modules if m.startswith("toyplugins")]:
            del sys.modules[name]


FOUND: Registry[str] = Registry("found", key="found")


def test_every_plugin_kind_is_one_registry() -> None:
    assert {"fedsgd", "fedavg", "dp", "topk", "quantize", "local_dp"} <= set(DEFENCES)
    assert set(BEHAVIOURS) == {"honest", "isolate", "sparsify", "trap"}
    assert set(ATTACKS) == {"spearpp", "inversion", "analytic"}
    assert {"pool", "ray"} <= set(EXECUTORS)
    for registry in (DEFENCES, BEHAVIOURS, ATTACKS, EXECUTORS):
        assert isinstance(registry, Registry)
