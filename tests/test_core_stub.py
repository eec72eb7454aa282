"""pld/_core.pyi, the stub type checkers read, against the C module: every
function and method it declares takes the parameters it names, of the kinds
it says (a C function that takes no keywords is positional-only there), with
the defaults it gives. The runtime side is the text signature in each C
docstring, which inspect.signature reads."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pld
from pld import _core

STUB = Path(pld.__file__).with_name("_core.pyi")


def _stub_parameters(fn: ast.FunctionDef, method: bool):
    args = fn.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + args.defaults
    out = []
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        kind = "POSITIONAL_ONLY" if i < len(args.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        out.append((arg.arg, kind, None if default is None else ast.literal_eval(default)))
    if args.vararg:
        out.append((args.vararg.arg, "VAR_POSITIONAL", None))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        out.append((arg.arg, "KEYWORD_ONLY", None if default is None else ast.literal_eval(default)))
    return out[1:] if method else out


def _runtime_parameters(obj):
    out = [(p.name, p.kind.name, None if p.default is p.empty else p.default)
           for p in inspect.signature(obj).parameters.values()]
    return out[1:] if out and out[0][0] == "self" else out


def _declared():
    """(name, runtime object, stub def, is a method) for each def of the stub."""
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            yield node.name, getattr(_core, node.name), node, False
        elif isinstance(node, ast.ClassDef):
            cls = getattr(_core, node.name)
            for fn in node.body:
                if not isinstance(fn, ast.FunctionDef) or any(
                        isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list):
                    continue
                if fn.name.startswith("__") and fn.name != "__init__":
                    continue
                yield f"{node.name}.{fn.name}", cls if fn.name == "__init__" else getattr(cls, fn.name), fn, True


def test_the_stub_declares_what_the_c_module_takes():
    checked, wrong = 0, []
    for name, obj, fn, method in _declared():
        stub, runtime = _stub_parameters(fn, method), _runtime_parameters(obj)
        if stub != runtime:
            wrong.append(f"{name}: stub {stub}, C {runtime}")
        checked += 1
    assert not wrong, "\n".join(wrong)
    assert checked >= 25  # (every function and method of the stub was read)


def test_a_positional_only_parameter_is_refused_by_keyword():
    """What the stub's `/` says, the C function does."""
    index = _core.NgramIndex(3, 1)
    try:
        index.extend(tokens=[1, 2])
    except TypeError as e:
        assert "keyword" in str(e)
    else:
        raise AssertionError("extend took a keyword")
