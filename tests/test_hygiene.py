"""What `import allocconf` must never do, and what it is made of."""
import importlib.machinery

import allocconf
from support import run_json, torch_facts


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
