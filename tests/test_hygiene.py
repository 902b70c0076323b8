"""What `import allocconf` must never do, and what it is made of."""
import importlib.machinery
import os

import pytest

import allocconf
from helpers import run_json, torch_facts


def test_import_alone_leaves_torch_and_environment_alone():
    out = run_json("""
        import os
        before = dict(os.environ)
        import allocconf
        print(json.dumps({
            "torch": sorted(m for m in sys.modules if m.split(".")[0] == "torch"),
            "environ_same": dict(os.environ) == before,
            "status": allocconf.status().as_dict()}))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert out["torch"] == []
    assert out["environ_same"] is True
    st = out["status"]
    assert st["torch_imported"] is False
    assert st["applied"] is False
    assert st["config"] == "max_split_size_mb:64,expandable_segments:True"
    assert "torch not imported yet" in st["reason"]


def test_environment_unchanged_after_torch_and_windows():
    out = run_json("""
        import os
        before = dict(os.environ)
        import allocconf, torch
        with allocconf.ipc_safe():
            allocconf.configure(max_split_size_mb=128)
        print(json.dumps({"same": dict(os.environ) == before,
                          "cuda_initialized": torch.cuda.is_initialized()}))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert out == {"same": True, "cuda_initialized": False}


def test_no_deprecated_setter_and_no_warning():
    # The children run with warnings as errors: a FutureWarning from torch's
    # deprecated setter would fail them.  And the setter used is _C's own.
    out = run_json("""
        import allocconf, torch
        with allocconf.ipc_safe():
            pass
        print(json.dumps(allocconf.status().api))
    """)
    assert out == torch_facts()["setter"]


def test_the_core_is_a_compiled_extension():
    loader = allocconf._C.__loader__
    assert isinstance(loader, importlib.machinery.ExtensionFileLoader)
    assert allocconf._C.__file__.endswith(
        tuple(importlib.machinery.EXTENSION_SUFFIXES))
    for name in ("parse", "merge", "configure", "status", "driver_info",
                 "pidfd_probe"):
        assert type(getattr(allocconf._C, name)).__name__ == (
            "builtin_function_or_method")
    # The windows' __enter__/__exit__ are C methods, not Python functions.
    for name in ("__enter__", "__exit__"):
        assert type(getattr(allocconf.expandable_segments, name)).__name__ \
            == "method_descriptor"


def test_error_and_warning_types():
    assert issubclass(allocconf.AllocConfError, ValueError)
    assert issubclass(allocconf.AllocConfWarning, UserWarning)
    assert allocconf.AllocConfError.__module__ == "allocconf"


def test_status_is_a_frozen_dataclass():
    import dataclasses

    st = allocconf.status()
    assert isinstance(st, allocconf.Status)
    assert dataclasses.is_dataclass(st)
    try:
        st.applied = False
    except dataclasses.FrozenInstanceError:
        pass
    else:  # pragma: no cover
        raise AssertionError("Status is not frozen")
    assert set(st.as_dict()) == {f.name for f in dataclasses.fields(st)}


def test_import_is_cheap():
    # Nothing heavy is imported at `import allocconf`.
    out = run_json("""
        before = set(sys.modules)
        import allocconf
        print(json.dumps(sorted(set(sys.modules) - before)))
    """)
    heavy = {"dataclasses", "inspect", "logging", "typing", "importlib.abc",
             "ctypes", "allocconf._status"}
    assert heavy.isdisjoint(out), out
    assert "allocconf._C" in out and "allocconf._hook" in out


def test_the_stub_names_every_function_of_the_extension():
    import os
    import allocconf._C as C

    stub = os.path.join(os.path.dirname(allocconf.__file__), "_C.pyi")
    with open(stub) as f:
        text = f.read()
    missing = [name for name in dir(C)
               if callable(getattr(C, name)) and not name.startswith("__")
               and f"def {name}(" not in text and f"class {name}" not in text]
    assert missing == []


# The layers of csrc/, lowest first (docs/design.md, "Layers"): a file may
# include headers of its own layer or of lower ones, never of a higher one;
# and no C file calls into a higher layer, nor into one that calls back
# into it, directly or around a circle.
LAYERS = {"": 0, "grammar": 1, "driver": 1, "state": 2, "torchio": 3,
          "api": 4}
CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "csrc")


def _layer(path):
    """The layer of csrc/<path> (module.c is the top)."""
    folder = os.path.dirname(path)
    return 5 if path == "module.c" else LAYERS[folder]


def _sources(ext):
    for folder, _, files in os.walk(CSRC):
        for name in sorted(files):
            if name.endswith(ext):
                yield os.path.relpath(os.path.join(folder, name),
                                      CSRC).replace(os.sep, "/")


def test_csrc_files_include_only_their_own_layer_or_lower():
    import re

    upward = []
    for path in list(_sources(".c")) + list(_sources(".h")):
        with open(os.path.join(CSRC, path)) as f:
            for inc in re.findall(r'^#include "([^"]+)"', f.read(), re.M):
                if not os.path.exists(os.path.join(CSRC, inc)):
                    upward.append((path, inc, "no such header"))
                elif _layer(inc) > _layer(path):
                    upward.append((path, inc))
    assert upward == []
    assert {os.path.dirname(p) for p in _sources(".c")} == set(LAYERS)


def test_csrc_calls_go_down_the_layers_and_never_round_a_circle(tmp_path):
    # Which C file calls which, from the compiled objects' symbols.
    import shutil
    import subprocess
    import sysconfig

    cc = shutil.which("cc") or shutil.which("gcc")
    nm = shutil.which("nm")
    if cc is None or nm is None:
        pytest.skip("needs a C compiler and nm")
    defined, wanted = {}, {}
    for path in _sources(".c"):
        obj = tmp_path / (path.replace("/", "_") + ".o")
        subprocess.run([cc, "-c", "-std=c11", "-fPIC", "-I", CSRC, "-I",
                        sysconfig.get_paths()["include"],
                        os.path.join(CSRC, path), "-o", str(obj)],
                       check=True, capture_output=True)
        symbols = subprocess.run([nm, "-P", str(obj)], check=True,
                                 capture_output=True, text=True).stdout
        wanted[path] = set()
        for line in symbols.splitlines():
            name, kind = line.split()[:2]
            if kind == "U":
                wanted[path].add(name)
            elif kind.isupper():
                defined[name] = path
    calls = {path: {defined[n] for n in names if n in defined} - {path}
             for path, names in wanted.items()}
    upward = sorted((a, b) for a, callees in calls.items() for b in callees
                    if _layer(b) > _layer(a))
    assert upward == []
    # Any circle shows as a file that reaches itself.
    circles = []
    for start in calls:
        seen, todo = set(), list(calls[start])
        while todo:
            f = todo.pop()
            if f == start:
                circles.append(start)
                break
            if f not in seen:
                seen.add(f)
                todo.extend(calls[f])
    assert circles == []
    # The grammar calls nothing of the rest: the fuzzer links it alone.
    assert all(_layer(b) == 1 for a, callees in calls.items()
               if a.startswith("grammar/") for b in callees)


# The modules of python/allocconf/transfer/, lowest first (the package's
# docstring): each imports only modules listed before it, so no two
# import each other; and each is read in one sitting.
TRANSFER = ["_errors", "_messages", "_tensors", "_layout", "_copies",
            "_device", "_replay", "_channel", "_sender", "_receiver",
            "_targets", "_writer", "testing", "__init__"]


def test_the_transfer_modules_import_only_those_below_them():
    import ast

    folder = os.path.join(os.path.dirname(allocconf.__file__), "transfer")
    found = sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py"))
    assert found == sorted(TRANSFER), "place a new module in TRANSFER"
    for rank, name in enumerate(TRANSFER):
        with open(os.path.join(folder, name + ".py")) as f:
            text = f.read()
        assert len(text.splitlines()) <= 520, name
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.ImportFrom) or not node.module:
                continue
            parts = node.module.split(".")
            if parts[:2] != ["allocconf", "transfer"]:
                continue
            used = parts[2] if len(parts) > 2 else "__init__"
            assert used in TRANSFER[:rank], (name, node.module)
