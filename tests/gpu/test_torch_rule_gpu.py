"""PyTorch's test_allocator_settings sequence on a GPU, with allocconf
imported (docs/design.md, "Whose keys win").

torch's own test (test/test_cuda.py) writes setter strings one after
another and checks the allocator's memory figures after each: that
roundup_power2_divisions rounds allocations up, and that a later write
which leaves it out resets it ("should have reset the power2 divisions
now").  allocconf's rule for other components' writes must keep that
true: this runs the same sequence, with the same checks, without
allocconf (the oracle) and with it imported before torch, and after torch
and CUDA are up.  The CPU suite checks the same sequence string for
string (tests/test_torch_rule.py).
"""
import pytest

from helpers import run_json

pytestmark = pytest.mark.gpu

SEQUENCE = """
import warnings
warnings.simplefilter("ignore", FutureWarning)  # the deprecated setter
if ORDER == "allocconf first":
    import allocconf
import torch
torch.cuda.init()
if ORDER == "after CUDA":
    import allocconf
set_ = torch.cuda.memory._set_allocator_settings  # what torch's test calls

def power2_div(size, div_factor):
    pow2 = 1
    while pow2 < size:
        pow2 *= 2
    if pow2 == size:
        return pow2
    step = pow2 / 2 / div_factor
    ret = pow2 / 2
    while ret < size:
        ret += step
    return ret

def allocated():
    return torch.cuda.memory_stats()["active_bytes.all.allocated"]

def requested():
    return torch.cuda.memory_stats()["requested_bytes.all.allocated"]

checks = []
def check(name, got, expected):
    checks.append([name, int(got), int(expected)])

nelems = 21 * 1024 * 1024
nbytes = 4 * nelems
nbytes_big = 4 * 100 * 1024 * 1024
keep = []

torch.cuda.memory.empty_cache()
start = allocated()
set_("")
keep.append(torch.rand(nelems, device="cuda"))
reg = allocated()
start_req = requested()
set_("roundup_power2_divisions:4")
keep.append(torch.rand(nelems, device="cuda"))
check("plain allocation", reg - start, nbytes)
check("rounded up by roundup_power2_divisions:4", allocated() - reg,
      power2_div(nbytes, 4))
check("requested bytes", requested() - start_req, nbytes)

set_("garbage_collection_threshold:0.5")
set_("garbage_collection_threshold:0.5,max_split_size_mb:40")
torch.cuda.memory.empty_cache()
start = allocated()
keep.append(torch.rand(nelems, device="cuda"))
check("power2 divisions reset by the next write", allocated() - start,
      nbytes)

torch.cuda.memory.empty_cache()
set_("garbage_collection_threshold:0.5,"
     "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]")
start = allocated()
keep.append(torch.rand(nelems, device="cuda"))
check("list syntax, 8 divisions", allocated() - start, power2_div(nbytes, 8))
torch.cuda.memory.empty_cache()
start = allocated()
keep.append(torch.rand(100 * 1024 * 1024, device="cuda"))
check("list syntax, 2 divisions", allocated() - start,
      power2_div(nbytes_big, 2))

torch.cuda.memory.empty_cache()
set_("release_lock_on_cudamalloc:True")
start = allocated()
keep.append(torch.rand(nelems, device="cuda"))
check("divisions reset again", allocated() - start, nbytes)

refused = []
for conf in ["foo:1,bar:2", "garbage_collection_threshold:1.2",
             "max_split_size_mb:2", "release_lock_on_cudamalloc:none",
             "pinned_use_cuda_host_register:none",
             "pinned_num_register_threads:none",
             "pinned_num_register_threads:1024"]:
    try:
        torch._C._accelerator_setAllocatorSettings(conf)
        refused.append([conf, None])
    except Exception as exc:
        refused.append([conf, type(exc).__name__])
st = allocconf.status() if ORDER != "alone" else None
print(json.dumps({"checks": checks, "refused": refused,
                  "es": None if st is None else st.expandable_segments}))
"""


@pytest.mark.parametrize("order", ["alone", "allocconf first",
                                   "after CUDA"])
def test_torchs_allocator_settings_sequence(order):
    out = run_json(f"ORDER = {order!r}", SEQUENCE, timeout=300)
    wrong = [c for c in out["checks"] if c[1] != c[2]]
    assert wrong == [], wrong
    assert len(out["checks"]) == 7
    # torch refuses every one of them itself, with ValueError.
    assert [r[1] for r in out["refused"]] == ["ValueError"] * 7, out["refused"]
    if order != "alone":
        assert out["es"] is True
