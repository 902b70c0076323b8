"""torch's own rule for writes by other components, with allocconf
imported (docs/design.md, "Whose keys win").

PyTorch's test_allocator_settings (test/test_cuda.py) writes a sequence of
strings through torch's setter and checks after each that the keys the
write left out went back to torch's defaults ("should have reset the
power2 divisions now").  Components rely on that: a write is a whole
configuration.  Here the same sequence runs, through each of torch's three
setter names, in a child with allocconf imported and in one without, and
what torch holds after each step (its getter, torch 2.13+) is compared:
the keys a write names take its values, the keys it leaves out go back to
the user's value (or torch's default), never to an earlier write's, and
allocconf adds expandable_segments:True.  tests/gpu/test_torch_rule_gpu.py
runs the sequence against the allocator's memory figures on a GPU.
"""
import pytest

from helpers import run_json, torch_facts

pytestmark = pytest.mark.skipif(
    not torch_facts()["getter"],
    reason="needs torch 2.13+: its getter says what torch holds")

# test_allocator_settings' writes, in its order.
STEPS = [
    "",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:0.5",
    "garbage_collection_threshold:0.5,max_split_size_mb:40",
    "garbage_collection_threshold:0.5,"
    "roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]",
    "release_lock_on_cudamalloc:True",
]
# ... and the ones it expects torch to refuse (a CPU build refuses those of
# the keys it validates; a CUDA build all of them).
INVALID = [
    "foo:1,bar:2",
    "garbage_collection_threshold:1.2",
    "max_split_size_mb:2",
    "release_lock_on_cudamalloc:none",
    "pinned_use_cuda_host_register:none",
    "pinned_num_register_threads:none",
    "pinned_num_register_threads:1024",
]

# The three names torch's setter goes by.  The 2.1-2.9 one is not in a CPU
# build of 2.13: it is planted, as an alias of the 2.10 one, before
# allocconf wraps torch's setters (allocconf wraps it wherever it exists).
SETTERS = {
    "accelerator": "torch._C._accelerator_setAllocatorSettings",
    "cuda": "torch._C._cuda_cudaCachingAllocator_set_allocator_settings",
    "deprecated": "torch.cuda.memory._set_allocator_settings",
}

USER = "max_split_size_mb:64,pinned_use_background_threads:True"

SEQUENCE = """
import warnings
warnings.simplefilter("ignore", FutureWarning)  # the deprecated setter's
import torch
if not hasattr(torch._C, "_cuda_cudaCachingAllocator_set_allocator_settings"):
    torch._C._cuda_cudaCachingAllocator_set_allocator_settings = (
        torch._C._accelerator_setAllocatorSettings)
if WITH_ALLOCCONF:
    import allocconf
get = torch._C._accelerator_getAllocatorSettings

def write(conf):
    setter = eval(SETTER)  # looked up now: allocconf may have wrapped it
    setter(conf)

held, verdicts = [], []
for conf in STEPS:
    write(conf)
    held.append(get())
for conf in INVALID:
    before = get()
    try:
        write(conf)
        verdicts.append(["accepted", get()])
    except Exception as exc:
        verdicts.append([type(exc).__name__, get() == before])
    write("")  # every write replaces the last: start the next from nothing
print(json.dumps({"held": held, "verdicts": verdicts}))
"""


def sequence(setter, with_allocconf, env=None):
    return run_json(f"STEPS = {STEPS!r}\nINVALID = {INVALID!r}\n"
                    f"SETTER = {SETTERS[setter]!r}\n"
                    f"WITH_ALLOCCONF = {with_allocconf!r}\n", SEQUENCE,
                    env=env)


def parse(conf):
    import allocconf

    return allocconf.parse(conf)


@pytest.mark.parametrize("user", [None, USER], ids=["no-variable",
                                                     "user-variable"])
@pytest.mark.parametrize("setter", sorted(SETTERS))
def test_each_write_replaces_the_last_with_the_users_keys_as_the_floor(
        setter, user):
    env = {"PYTORCH_CUDA_ALLOC_CONF": user} if user else None
    alone = sequence(setter, False, env)
    ours = sequence(setter, True, env)
    floor = parse(user or "")
    for i, conf in enumerate(STEPS):
        # torch alone holds the step's string and nothing else ...
        assert alone["held"][i] == conf
        # ... allocconf the user's keys under it, and its default on top.
        expected = {**floor, **parse(conf), "expandable_segments": "True"}
        assert parse(ours["held"][i]) == expected, (i, conf)


def test_the_documented_steps_string_for_string():
    # The rule, spelled out for the first steps (docs/neighbours.md): the
    # power2 divisions of step 2 are gone at step 3, and the user's
    # max_split_size_mb comes back once a write stops naming it.
    ours = sequence("accelerator", True, {"PYTORCH_CUDA_ALLOC_CONF": USER})
    assert ours["held"][:5] == [
        "max_split_size_mb:64,pinned_use_background_threads:True,"
        "expandable_segments:True",
        "max_split_size_mb:64,pinned_use_background_threads:True,"
        "roundup_power2_divisions:4,expandable_segments:True",
        "max_split_size_mb:64,pinned_use_background_threads:True,"
        "garbage_collection_threshold:0.5,expandable_segments:True",
        "max_split_size_mb:40,pinned_use_background_threads:True,"
        "garbage_collection_threshold:0.5,expandable_segments:True",
        "max_split_size_mb:64,pinned_use_background_threads:True,"
        "garbage_collection_threshold:0.5,roundup_power2_divisions:"
        "[64:8,128:2,256:2,512:2,1024:1,>:1],expandable_segments:True",
    ]


@pytest.mark.parametrize("setter", sorted(SETTERS))
def test_torch_refuses_what_it_refuses_alone_and_keeps_what_it_held(setter):
    alone = sequence(setter, False)
    ours = sequence(setter, True)
    for conf, (kind, _), (our_kind, kept) in zip(INVALID, alone["verdicts"],
                                                 ours["verdicts"]):
        assert our_kind == kind, conf  # the same exception, or none
        if kind != "accepted":
            # torch alone is left half-applied (it keeps the string it
            # refused); with allocconf it holds what it held.
            assert kept is True, conf
    if torch_facts()["cpu_only"]:
        # A CPU build validates 9 keys: these two are among them.
        assert [v[0] for v in alone["verdicts"]][1:3] == ["ValueError"] * 2


STICKY_STEPS = [
    "large_segment_size_mb:40",
    "max_split_size_mb:64",
    "expandable_segments:False",
    "garbage_collection_threshold:0.5",
    "expandable_segments:True,large_segment_size_mb:20",
    "",
]


def test_sticky_keys_a_write_set_stay_as_torch_keeps_them():
    # torch keeps expandable_segments and large_segment_size_mb when a
    # write leaves them out; allocconf names them, so that what it writes
    # says what torch holds.
    out = run_json(f"STEPS = {STICKY_STEPS!r}", """
        import allocconf, torch
        set_ = torch._C._accelerator_setAllocatorSettings
        get = torch._C._accelerator_getAllocatorSettings
        held = []
        for conf in STEPS:
            set_(conf)
            held.append(get())
        print(json.dumps(held))
    """)
    assert out == [
        "large_segment_size_mb:40,expandable_segments:True",
        "max_split_size_mb:64,large_segment_size_mb:40,"
        "expandable_segments:True",
        "expandable_segments:False,large_segment_size_mb:40",
        "garbage_collection_threshold:0.5,expandable_segments:False,"
        "large_segment_size_mb:40",
        "expandable_segments:True,large_segment_size_mb:20",
        "expandable_segments:True,large_segment_size_mb:20",
    ]


def test_windows_carry_the_floor_and_the_last_write_only():
    out = run_json("""
        import allocconf, torch
        set_ = torch._C._accelerator_setAllocatorSettings
        get = torch._C._accelerator_getAllocatorSettings
        set_("roundup_power2_divisions:4")
        set_("garbage_collection_threshold:0.5")
        with allocconf.ipc_safe():
            inside = get()
        print(json.dumps([inside, get(), allocconf.status().config]))
    """, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert out == [
        "max_split_size_mb:64,garbage_collection_threshold:0.5,"
        "expandable_segments:False",
        "max_split_size_mb:64,garbage_collection_threshold:0.5,"
        "expandable_segments:True",
        "max_split_size_mb:64,garbage_collection_threshold:0.5,"
        "expandable_segments:True",
    ]


def test_configure_names_keys_over_an_earlier_write_and_keeps_the_rest():
    out = run_json("""
        import allocconf, torch
        set_ = torch._C._accelerator_setAllocatorSettings
        get = torch._C._accelerator_getAllocatorSettings
        set_("garbage_collection_threshold:0.5,max_split_size_mb:128")
        allocconf.configure(max_split_size_mb=256)   # the newer choice
        first = get()
        set_("roundup_power2_divisions:2")            # replaces the write
        print(json.dumps([first, get()]))
    """)
    assert out == [
        "max_split_size_mb:256,garbage_collection_threshold:0.5,"
        "expandable_segments:True",
        "max_split_size_mb:256,roundup_power2_divisions:2,"
        "expandable_segments:True",
    ]
