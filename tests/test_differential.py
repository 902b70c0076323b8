"""allocconf's grammar against torch's own setter, string for string.

A few thousand strings made of the 9 keys torch validates on a CPU build
(docs/design.md), with numbers in every form std::stoull and std::stod
read or refuse, booleans, lists and separators, non-ASCII and control
bytes, go through allocconf.parse and
through torch's setter; every string one accepts and the other refuses is
a failure.  torch's setter is stateful (it keeps large_segment_size_mb and
checks max_split_size_mb against it), so before each string torch is
given its defaults back.  The strings come from a fixed seed: a failure
names the string, and the same run reproduces it.
"""
import random

import pytest

from helpers import run_json, torch_facts

# The keys a CPU build of torch validates, by the kind of value.
INTEGER_KEYS = ("max_split_size_mb", "max_non_split_rounding_mb",
                "large_segment_size_mb", "pinned_max_round_threshold_mb",
                "pinned_max_cached_size_mb")
FRACTION_KEYS = ("garbage_collection_threshold",)
BOOL_KEYS = ("expandable_segments", "pinned_use_background_threads")
ROUNDUP_KEYS = ("roundup_power2_divisions",)
KEYS = INTEGER_KEYS + FRACTION_KEYS + BOOL_KEYS + ROUNDUP_KEYS

RESET = "expandable_segments:False,large_segment_size_mb:20"
COUNT = 4000
SEED = 20261203


def integer(rng: random.Random) -> str:
    digits = rng.choice([
        "0", "1", "8", "10", "11", "19", "20", "21", "64", "100", "128",
        "256", "4096", "2147483647", "2147483648", "4294967296",
        "17592186044415", "17592186044416", "18446744073709551615",
        "18446744073709551616", "99999999999999999999",
        str(rng.randrange(0, 1 << 70)), str(rng.randrange(0, 200)),
    ])
    prefix = rng.choice(["", "", "", "+", "-", "0", "00", " "])
    suffix = rng.choice(["", "", "", ".", ".5", "e2", "abc", "x", "MB",
                         " ", "-1", "\u00e9", "\x01", "\x7f", "\u00a0",
                         "\x0b", "\u0664"])
    if rng.random() < 0.05:
        return rng.choice(["", "+", "-", "abc", "0x40", ".5", "e3", "+-1",
                           "- 5", "6 4"])
    return prefix + digits + suffix


def fraction(rng: random.Random) -> str:
    if rng.random() < 0.4:
        return rng.choice([
            "0.5", ".5", "5e-1", "5E-1", "1e-3", "1e-05", "+0.5", "-0.5",
            "0.5x", "0x1p-1", "0x0.8p0", "inf", "-inf", "nan", "NaN",
            "infinity", "1e-310", "1e-400", "4.9e-324", "1e-308",
            "2.2250738585072014e-308", ".99999999999999999",
            "0.9999999999999999", "1", "1.0", "0", "0.", "4.", ".", "",
            "+", "0.5.5", "1e", "1e+", "0 .5", "e-1", "0x", "0x.8",
            "0.5\u00e9", "0.5\x01", "\x010.5", "0\u00a0.5",
        ])
    value = rng.choice([rng.random(), rng.random() * 2 - 0.5,
                        10 ** -rng.randrange(0, 330)])
    text = rng.choice([repr(value), f"{value:.3f}", f"{value:e}",
                       f"{value:.20f}", f"{value:g}"])
    return text


def boolean(rng: random.Random) -> str:
    return rng.choice(["True", "False", "True", "False", "true", "false",
                       "1", "0", "TRUE", "Tr ue", " False ", "", "None",
                       "True\u00e9", "\x07True", "Tr\x0bue", "False\x7f"])


def roundup(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return integer(rng)
    items = []
    for _ in range(rng.randrange(0, 4)):
        interval = rng.choice([">", "1", "2", "64", "256", "255", "1024",
                               "0", "-64", "+64", "64x", integer(rng)])
        divisions = rng.choice(["0", "1", "2", "3", "4", "8", "16", "-8",
                                "+8", "8y", integer(rng)])
        items.append(f"{interval}:{divisions}")
    if items and rng.random() < 0.05:
        items = [items[0].split(":")[0]]  # "[64]": both refuse it
    body = ",".join(items)
    return "[" + body + rng.choice(["]", "]", "]", ",]", ""])


def value_for(key: str, rng: random.Random) -> str:
    if key in INTEGER_KEYS:
        return integer(rng)
    if key in FRACTION_KEYS:
        return fraction(rng)
    if key in BOOL_KEYS:
        return boolean(rng)
    return roundup(rng)


# A value every torch that knows the key accepts, to ask whether it does.
SAMPLE = {**{k: "64" for k in INTEGER_KEYS}, **{k: "0.5" for k in
          FRACTION_KEYS}, **{k: "True" for k in BOOL_KEYS},
          **{k: "4" for k in ROUNDUP_KEYS}}


def generate(count: int = COUNT, seed: int = SEED, keys=KEYS) -> list:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        entries = [f"{k}:{value_for(k, rng)}"
                   for k in rng.sample(keys, min(len(keys),
                                                 rng.randrange(1, 4)))]
        if rng.random() < 0.15 and "large_segment_size_mb" in keys:
            entries.insert(rng.randrange(0, len(entries) + 1),
                           f"large_segment_size_mb:{integer(rng)}")
        text = ",".join(entries)
        if rng.random() < 0.1:
            text += ","
        out.append(text)
    return out


def test_generator_covers_both_verdicts_of_allocconf():
    # The test below is only worth something if the strings are not all
    # accepted or all refused.
    from allocconf import AllocConfError, parse

    verdicts = set()
    for conf in generate(400):
        try:
            parse(conf)
            verdicts.add(True)
        except AllocConfError:
            verdicts.add(False)
    assert verdicts == {True, False}


def test_allocconf_accepts_and_refuses_what_torch_does():
    if not torch_facts()["new_setter"]:
        pytest.skip("needs torch 2.10+ (its run-time setter validates the "
                    "9 keys without a GPU)")
    out = run_json(f"""
        import allocconf, torch
        from allocconf import AllocConfError
        from test_differential import KEYS, SAMPLE, generate
        setter = torch._C._accelerator_setAllocatorSettings
        def accepts(conf):
            try:
                setter(conf)
                return True
            except Exception:
                return False
        # CUDA builds refuse keys newer than they are: only the keys this
        # torch knows (a CPU build 2.13+ knows all 9).
        known = [k for k in KEYS if accepts(f"{{k}}:{{SAMPLE[k]}}")]
        strings = generate(keys=known)
        disagree = []
        accepted = 0
        for conf in strings:
            setter({RESET!r})
            try:
                setter(conf)
                torch_ok, why = True, None
            except Exception as exc:
                torch_ok, why = False, str(exc).splitlines()[0][:120]
            try:
                allocconf.parse(conf)
                ours, our_why = True, None
            except AllocConfError as exc:
                ours, our_why = False, str(exc)[:160]
            accepted += torch_ok
            if torch_ok != ours:
                disagree.append([conf, torch_ok, why, our_why])
        setter({RESET!r})
        print(json.dumps({{"disagree": disagree, "accepted": accepted,
                          "known": known}}))
    """, timeout=300)
    if torch_facts()["cpu_only"]:
        assert out["known"] == list(KEYS)
    # Both verdicts are well represented, so agreement means something.
    assert COUNT * 0.15 < out["accepted"] < COUNT * 0.85, out["accepted"]
    assert out["disagree"] == [], "\n".join(
        f"{conf!r}: torch {'accepts' if ok else 'refuses'} ({why}); "
        f"allocconf: {ours}" for conf, ok, why, ours in out["disagree"][:25])


# Where torch ignores a misplaced separator (its checkToken returns a bool
# that its parsers drop), it reads something the user did not write;
# allocconf refuses these on purpose, pointing at the separator.  If torch
# starts refusing them too, this test says so.
MISREAD = [
    ("max_split_size_mb,64", 17),
    ("garbage_collection_threshold]0.5", 28),
    ("expandable_segments:True:max_split_size_mb:64", 24),
    ("roundup_power2_divisions:[1024,0]", 26),
    ("roundup_power2_divisions:[>,2]", 26),
]


def test_stricter_than_torch_only_where_torch_misreads_a_separator():
    if not torch_facts()["new_setter"]:
        pytest.skip("needs torch 2.10+")
    out = run_json(f"""
        import allocconf, torch
        setter = torch._C._accelerator_setAllocatorSettings
        result = []
        for conf, _ in {MISREAD!r}:
            setter({RESET!r})
            setter(conf)  # torch accepts it
            try:
                allocconf.parse(conf)
                result.append(None)
            except allocconf.AllocConfError as exc:
                result.append(exc.offset)
        setter({RESET!r})
        print(json.dumps(result))
    """)
    assert out == [offset for _, offset in MISREAD]
