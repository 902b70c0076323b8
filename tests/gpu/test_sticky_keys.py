"""Sticky keys, on the GPU: torch keeps expandable_segments and
large_segment_size_mb when a write leaves them out, so allocconf names
them on every write that changes them.  New segments after a window, or
after configure(expandable_segments=None), follow what status() says."""
import pytest

from helpers import run_json

pytestmark = pytest.mark.gpu

PRELUDE = """
import allocconf, torch
from helpers.gpu import alloc, expandable, settings
def fresh():
    # A new segment: empty the cache so the next tensor cannot reuse one.
    torch.cuda.empty_cache()
    return expandable(alloc(64))
"""


def test_segments_after_an_on_window_are_classic_again():
    # 0.1.0 wrote "max_split_size_mb:64" when the window closed; torch kept
    # expandable segments on while status() said off.
    out = run_json(PRELUDE, """
        before = fresh()
        with allocconf.expandable_segments(True):
            inside = fresh()
        after = fresh()
        st = allocconf.status()
        print(json.dumps({"before": before, "inside": inside, "after": after,
                          "status": st.expandable_segments,
                          "max_split": torch.cuda.memory_stats()[
                              "max_split_size"]}))
    """, env={"ALLOCCONF_AUTO": "0",
              "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert out == {"before": False, "inside": True, "after": False,
                   "status": False, "max_split": 64 << 20}


def test_segments_after_configure_none_follow_status():
    out = run_json(PRELUDE, """
        allocconf.configure(expandable_segments=True)
        on = [fresh(), allocconf.status().expandable_segments]
        allocconf.configure(expandable_segments=None)
        off = [fresh(), allocconf.status().expandable_segments]
        print(json.dumps({"on": on, "off": off}))
    """, env={"ALLOCCONF_AUTO": "0"})
    assert out == {"on": [True, True], "off": [False, False]}


def test_removing_large_segment_size_gives_torch_its_default_back():
    # A 2 MiB request gets a segment of the large segment size (classic
    # memory, so ALLOCCONF_AUTO=0): 20 MiB by default.
    out = run_json(PRELUDE, """
        from helpers.gpu import segment_of
        def segment_mib():
            torch.cuda.empty_cache()
            return segment_of(alloc(2))["total_size"] >> 20
        default = segment_mib()
        allocconf.configure(large_segment_size_mb=64)
        set_ = segment_mib()
        allocconf.configure(large_segment_size_mb=None)
        print(json.dumps([default, set_, segment_mib()]))
    """, env={"ALLOCCONF_AUTO": "0"})
    assert out == [20, 64, 20]
