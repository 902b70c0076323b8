"""What allocconf decides from torch's build: ROCm versions, setters of
older torch, no setter.  Each child hands allocconf a stand-in `torch`
module that carries only what allocconf reads (torch.version.*, the setter
in torch._C): the decision is tested, no GPU is pretended."""
import pytest

from helpers import run_json
from helpers.standin import decide, stand_in

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
        import threading, time
        def setter(conf):
            if "large_segment_size_mb" in conf:
                raise RuntimeError("Unrecognized CachingAllocator option: "
                                   "large_segment_size_mb")
            if "max_split_size_mb" in conf and not calls[-1:] == [conf]:
                time.sleep(0.5)  # holds allocconf's lock in the thread
            calls.append(conf)
    """, stand_in("2.9.1+cu128", "12.8",
                  setter="_cuda_cudaCachingAllocator_set_allocator_settings",
                  call="setter"), """
        from helpers.harness import forked
        def child():
            with allocconf.ipc_safe():
                pass
            return calls
        t = threading.Thread(
            target=lambda: allocconf.configure(max_split_size_mb=64))
        t.start()
        time.sleep(0.2)  # the thread is inside the setter: the child does
        code, got = forked(child)  # not know what torch holds
        t.join()
        print(json.dumps(got))
    """)
    assert isinstance(out, list), out  # else the window's error
    assert not any("large_segment_size_mb" in c for c in out), out
    # The child's restore, then the window's pair.
    assert out[-3:] == ["max_split_size_mb:64,expandable_segments:True",
                        "max_split_size_mb:64,expandable_segments:False",
                        "max_split_size_mb:64,expandable_segments:True"]
