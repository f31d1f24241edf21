"""The package is typed (py.typed ships with it): every public function, method and
property states its parameter and return types, and the hints resolve (a misspelt type
name fails here, not in a user's type checker)."""
import inspect
import os
import typing

import pytest

import loaderclient
from loaderclient import _lib, errors

DUNDERS_KEPT = {"__init__", "__getitem__", "__iter__", "__next__", "__len__", "__contains__", "__enter__",
                "__exit__", "__repr__"}


def _public_callables(cls):
    for name, member in vars(cls).items():
        if name.startswith("_") and name not in DUNDERS_KEPT:
            continue
        if isinstance(member, property):
            yield "%s.%s" % (cls.__name__, name), member.fget
        elif inspect.isfunction(member):
            yield "%s.%s" % (cls.__name__, name), member


def _check(qualname, fn, module_globals):
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn, globalns=module_globals)
    for p in list(sig.parameters.values())[1 if "." in qualname else 0:]:
        if p.kind is p.VAR_POSITIONAL and qualname.endswith("__exit__"):
            assert p.name in hints, qualname
            continue
        assert p.name in hints, "%s: parameter %r has no type" % (qualname, p.name)
    assert "return" in hints, "%s: no return type" % qualname


def _targets(module, names):
    out = []
    for name in names:
        obj = getattr(module, name)
        if inspect.isclass(obj) and not issubclass(obj, BaseException):
            for qn, fn in _public_callables(obj):
                out.append((qn, fn, vars(inspect.getmodule(fn))))
            for base in obj.__mro__[1:]:
                if base.__module__.startswith("loaderclient"):
                    for qn, fn in _public_callables(base):
                        out.append((qn, fn, vars(inspect.getmodule(fn))))
        elif inspect.isfunction(obj):
            out.append((name, obj, vars(inspect.getmodule(obj))))
    return out


def test_package_ships_py_typed():
    assert os.path.exists(os.path.join(os.path.dirname(loaderclient.__file__), "py.typed"))


def test_public_api_is_annotated():
    targets = _targets(loaderclient, loaderclient.__all__)
    assert len(targets) > 30
    for qualname, fn, g in targets:
        _check(qualname, fn, g)
    for fn in (errors.error_name, errors.make_error, _lib.find_library):
        _check(fn.__name__, fn, vars(inspect.getmodule(fn)))


def test_torch_loader_is_annotated():
    torch_mod = pytest.importorskip("loaderclient.torch")
    targets = _targets(torch_mod, ["LoaderdDataLoader"])
    assert len(targets) > 8
    for qualname, fn, g in targets:
        _check(qualname, fn, g)
