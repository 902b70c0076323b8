"""What allocconf decides from torch's build: ROCm versions, setters of
older torch, no setter.  Each child hands allocconf a stand-in `torch`
module that carries only what allocconf reads (torch.version.*, the setter
in torch._C): the decision is tested, no GPU is pretended."""
import pytest

from support import run_json

def stand_in(version, cuda=None, hip=None,
             setter="_accelerator_setAllocatorSettings", call="calls.append"):
    """Child-script text: a stand-in `torch` with `setter` (calling `call`,
    which records into `calls` by default), then `import allocconf`."""
    return f"""
import types
calls = []
torch = types.ModuleType("torch")
torch.__version__ = {version!r}
torch.version = types.SimpleNamespace(cuda={cuda!r}, hip={hip!r})
torch._C = types.SimpleNamespace()
if {setter!r}:
    setattr(torch._C, {setter!r}, {call})
sys.modules["torch"] = torch
import allocconf
"""


def decide(version, cuda=None, hip=None,
           setter="_accelerator_setAllocatorSettings", env=None):
    return run_json(stand_in(version, cuda, hip, setter), """
        print(json.dumps({"calls": calls,
                          "status": allocconf.status().as_dict()}))
    """, env=env)


@pytest.mark.parametrize("hip", ["6.2.41133-dd7f95766", "5.7.31921"])
def test_rocm_before_7_is_not_written(hip):
    out = decide("2.6.0+rocm6.2", hip=hip,
                 setter="_cuda_cudaCachingAllocator_set_allocator_settings")
    assert out["calls"] == []
    st = out["status"]
    assert st["applied"] is False
    assert st["expandable_segments"] is None
    assert st["reason"].startswith(f"ROCm {hip}: expandable segments need "
                                   f"ROCm 7")


def test_rocm_7_is_written_with_hip_variable():
    out = decide("2.10.0+rocm7.0", hip="7.0.51831",
                 env={"PYTORCH_HIP_ALLOC_CONF":
                      "release_lock_on_hipmalloc:True"})
    assert out["calls"] == ["release_lock_on_hipmalloc:True,"
                            "expandable_segments:True"]
    assert out["status"]["source"] == "PYTORCH_HIP_ALLOC_CONF"
    assert out["status"]["reason"] == ("expandable segments turned on by "
                                       "allocconf")


def test_older_torch_uses_the_cuda_setter():
    out = decide("2.6.0+cu124", cuda="12.4",
                 setter="_cuda_cudaCachingAllocator_set_allocator_settings")
    assert out["calls"] == ["expandable_segments:True"]
    assert out["status"]["api"] == (
        "torch._C._cuda_cudaCachingAllocator_set_allocator_settings")


def test_torch_without_a_setter_is_left_alone():
    out = decide("2.0.1+cpu", setter=None)
    assert out["calls"] == []
    st = out["status"]
    assert st["api"] is None
    assert st["applied"] is False
    assert st["reason"] == ("torch 2.0.1+cpu has no run-time allocator "
                            "setter; allocconf writes nothing")


def test_cpu_build_is_written_and_says_no_device_uses_it():
    out = decide("2.13.0+cpu")
    assert out["calls"] == ["expandable_segments:True"]
    assert "CPU-only build" in out["status"]["reason"]


def test_torch_before_2_10_is_never_sent_keys_it_does_not_know():
    # 2.6.0's and 2.9.1's setters refuse large_segment_size_mb (measured:
    # "Unrecognized CachingAllocator option"); a forked child, which must
    # give every sticky key its default back, once sent it and every
    # window there failed.
    out = run_json("""
        import os
        def setter(conf):
            if "large_segment_size_mb" in conf:
                raise RuntimeError("Unrecognized CachingAllocator option: "
                                   "large_segment_size_mb")
            calls.append(conf)
    """, stand_in("2.9.1+cu128", "12.8",
                  setter="_cuda_cudaCachingAllocator_set_allocator_settings",
                  call="setter"), """
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                with allocconf.ipc_safe():
                    pass
                got = calls
            except Exception as exc:
                got = repr(exc)
            os.write(w, json.dumps(got).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        print(os.read(r, 65536).decode())
    """)
    assert isinstance(out, list), out  # else the window's error
    assert not any("large_segment_size_mb" in c for c in out), out
    # The window's pair, after the child's restore.
    assert out[-2:] == ["expandable_segments:False",
                        "expandable_segments:True"]
