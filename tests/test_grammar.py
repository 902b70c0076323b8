"""The configuration grammar in allocconf._C: parse, merge, errors."""
import json
import random

import pytest

import allocconf
from allocconf import AllocConfError, merge, parse
from helpers import run_json, torch_facts

# Strings a user may really have, from torch's docs and docs/design.md.
VALID = [
    "",
    "expandable_segments:True",
    "max_split_size_mb:64,garbage_collection_threshold:0.6",
    "roundup_power2_divisions:[256:1,512:2,>:8]",
    "roundup_power2_divisions:4",
    "backend:native",
    "max_split_size_mb:128,expandable_segments:False,"
    "roundup_power2_divisions:[64:8,256:4,1024:4,>:1]",
    "pinned_use_background_threads:True,pinned_num_register_threads:8",
    "release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True",
    "release_lock_on_hipmalloc:False,pinned_use_hip_host_register:False",
    "garbage_collection_threshold:.5,per_process_memory_fraction:1",
    "large_segment_size_mb:64,max_non_split_rounding_mb:64",
    "pinned_max_round_threshold_mb:1024,pinned_max_cached_size_mb:0",
    "graph_capture_record_stream_reuse:True,pinned_free_catch_all:False",
    "throw_on_cudamalloc_oom:True,pinned_reserve_segment_size_mb:4",
    "expandable_segments_reserve_by_class:[weights:0.5,kv:40G]",
    "some_future_key:some_value",
    " expandable_segments : True , max_split_size_mb : 64 ",
    "expandable_segments:True,",
]


def test_parse_gives_values_as_text():
    assert parse("expandable_segments:True,max_split_size_mb:64") == {
        "expandable_segments": "True",
        "max_split_size_mb": "64",
    }


def test_parse_bracket_list_is_canonical():
    assert parse("roundup_power2_divisions: [ 256 : 1 , 512:2,>:8 ]") == {
        "roundup_power2_divisions": "[256:1,512:2,>:8]"
    }


def test_whitespace_is_dropped_as_torch_drops_it():
    # torch's ConfigTokenizer drops whitespace even inside a word.
    assert parse("\texpandable_segments :\nTrue ") == {
        "expandable_segments": "True"
    }
    assert parse("max split_size_mb:64") == {"maxsplit_size_mb": "64"}


def test_unknown_keys_are_kept_verbatim():
    conf = "future_key:abc,expandable_segments_reserve_by_class:[w:0.5,kv:40G]"
    assert parse(conf) == {
        "future_key": "abc",
        "expandable_segments_reserve_by_class": "[w:0.5,kv:40G]",
    }
    assert merge(conf) == conf


@pytest.mark.parametrize("conf, parsed", [
    # torch's tokenizer keeps every byte but separators and the C locale's
    # whitespace in a word, and std::stoull stops at the first non-digit.
    ("max_split_size_mb:64\u00e9", {"max_split_size_mb": "64\u00e9"}),
    ("max_split_size_mb:64\x01", {"max_split_size_mb": "64\x01"}),
    ("max_split_size_mb:64\x0b", {"max_split_size_mb": "64"}),
    ("\u00e9:1", {"\u00e9": "1"}),
    ("malloc_fraction=0.5:1", {"malloc_fraction=0.5": "1"}),
    ("a\x0cb:1", {"ab": "1"}),
    ("roundup_power2_divisions:[64\u00e9:2]",
     {"roundup_power2_divisions": "[64\u00e9:2]"}),
])
def test_non_ascii_and_control_bytes_are_read_as_torch_reads_them(conf,
                                                                  parsed):
    assert parse(conf) == parsed


def test_later_duplicate_wins_as_in_torch():
    assert parse("max_split_size_mb:64,max_split_size_mb:128") == {
        "max_split_size_mb": "128"
    }


def test_trailing_comma_is_accepted_and_dropped():
    assert merge("expandable_segments:True,") == "expandable_segments:True"


def test_empty_string_is_an_empty_configuration():
    assert parse("") == {}
    assert parse("   ") == {}
    assert merge("") == ""


@pytest.mark.parametrize(
    "conf, key, offset, text, words",
    [
        ("expandable_segments:maybe", "expandable_segments", 20, "maybe",
         "True or False"),
        ("expandable_segments:true", "expandable_segments", 20, "true",
         "True or False"),
        # torch reads numbers with stoull/stod: no digits is an error.
        ("expandable_segments:True,max_split_size_mb:x5",
         "max_split_size_mb", 43, "x5", "expected a number"),
        ("max_split_size_mb:-0", "max_split_size_mb", 18, "-0",
         "large segment size (20 MB by default)"),
        ("max_split_size_mb:10", "max_split_size_mb", 18, "10",
         "large segment size (20 MB by default)"),
        ("max_split_size_mb:99999999999999999999999", "max_split_size_mb",
         18, "99999999999999999999999", "out of range"),
        ("garbage_collection_threshold:1.0", "garbage_collection_threshold",
         29, "1.0", "between 0 and 1"),
        ("garbage_collection_threshold:0", "garbage_collection_threshold",
         29, "0", "between 0 and 1"),
        # .99999999999999999 reads as 1.0, 1e-310 underflows: torch
        # refuses both (tests/test_differential.py holds it to torch).
        ("garbage_collection_threshold:.99999999999999999",
         "garbage_collection_threshold", 29, ".99999999999999999",
         "read as 1"),
        ("garbage_collection_threshold:1e-310",
         "garbage_collection_threshold", 29, "1e-310", "out of range"),
        ("garbage_collection_threshold:nan",
         "garbage_collection_threshold", 29, "nan", "between 0 and 1"),
        ("per_process_memory_fraction:1.01", "per_process_memory_fraction",
         28, "1.01", "between 0 and 1"),
        ("roundup_power2_divisions:3", "roundup_power2_divisions", 25, "3",
         "power of two"),
        ("roundup_power2_divisions:[256:1,512:3]",
         "roundup_power2_divisions", 36, "3", "power of two"),
        ("roundup_power2_divisions:[255:1]", "roundup_power2_divisions", 26,
         "255", "interval must be a power of two"),
        ("roundup_power2_divisions:[256]", "roundup_power2_divisions", 26,
         "256", "interval:divisions"),
        ("roundup_power2_divisions:[256:1", "roundup_power2_divisions", 31,
         None, "unclosed"),
        ("roundup_power2_divisions:[256:1 512:2]",
         "roundup_power2_divisions", 30, "1512", "power of two"),
        ("pinned_num_register_threads:256", "pinned_num_register_threads",
         28, "256", "power of two <= 128"),
        ("pinned_num_register_threads:3", "pinned_num_register_threads", 28,
         "3", "power of two <= 128"),
        ("large_segment_size_mb:10", "large_segment_size_mb", 22, "10",
         "> 10"),
        ("backend:foo", "backend", 8, "foo", "native"),
        ("max_split_size_mb:[64]", "max_split_size_mb", 18, "[",
         "single value"),
        ("a:[b:[c]]", "a", 5, "[", "a value after ':'"),
        ("a:[[b]]", "a", 3, "[", "a list item"),
        ("large_segment_size_mb:64,max_non_split_rounding_mb:46",
         "max_non_split_rounding_mb", 51, "46",
         "large segment size (64 MB, large_segment_size_mb)"),
        ("max_split_size_mb:32,large_segment_size_mb:64",
         "max_split_size_mb", 18, "32",
         "large segment size (64 MB, large_segment_size_mb)"),
        ("expandable_segments", "expandable_segments", 19, None,
         "':' after the key"),
        ("expandable_segments:", "expandable_segments", 20, None,
         "a value"),
        ("expandable_segments:True]", "expandable_segments", 24, "]",
         "',' after the value"),
        ("expandable_segments:True:False", "expandable_segments", 24, ":",
         "',' after the value"),
        ("expandable_segments:True;max_split_size_mb:30",
         "expandable_segments", 20, "True;max_split_size_mb",
         "True or False"),
        (",", None, 0, ",", "a key"),
        ("expandable_segments:True,,max_split_size_mb:64", None, 25, ",",
         "a key"),
        ("expandable_segments:True\x00", None, 24, None, "NUL"),
        # Non-ASCII and control bytes belong to words, as in torch.
        ("expandable_segments:Tru\u00e9", "expandable_segments", 20,
         "Tru\u00e9", "True or False"),
        ("expandable_segments:\x07True", "expandable_segments", 20,
         "\x07True", "True or False"),
    ],
)
def test_errors_name_key_offset_and_text(conf, key, offset, text, words):
    with pytest.raises(AllocConfError) as info:
        parse(conf)
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.key, err.offset, err.text) == (key, offset, text)
    assert err.conf == conf
    message = str(err)
    assert words in message
    assert f"offset {offset}" in message
    if key is not None:
        assert message.startswith(f"{key} at offset {offset}: ")


def test_error_snippet_is_clipped_for_long_strings():
    conf = "future_key:x," * 40 + "max_split_size_mb:5"
    with pytest.raises(AllocConfError) as info:
        parse(conf)
    assert info.value.offset == len(conf) - 1
    assert "(in ...'" in str(info.value)
    assert len(str(info.value)) < 200


@pytest.mark.parametrize(
    "conf",
    [
        "max_split_size_mb:20",
        "garbage_collection_threshold:0.999",
        "per_process_memory_fraction:0",
        "per_process_memory_fraction:1.000",
        "pinned_num_register_threads:128",
        "roundup_power2_divisions:[>:0]",
        "roundup_power2_divisions:[]",
        "large_segment_size_mb:11",
        "backend:cudaMallocAsync",
        "backend:hipMallocAsync",
    ],
)
def test_boundaries_accepted(conf):
    key, _, value = conf.partition(":")
    assert parse(conf) == {key: value}


def test_parse_takes_str_only():
    with pytest.raises(TypeError, match="must be a str, not bytes"):
        parse(b"expandable_segments:True")


# -- merge ------------------------------------------------------------------


def test_merge_changes_only_named_keys_in_place():
    base = "max_split_size_mb:64,expandable_segments:True,future:x"
    assert merge(base, expandable_segments=False) == (
        "max_split_size_mb:64,expandable_segments:False,future:x"
    )


def test_merge_appends_new_keys_and_removes_with_none():
    base = "max_split_size_mb:64,garbage_collection_threshold:0.6"
    assert merge(base, garbage_collection_threshold=None,
                 expandable_segments=True) == (
        "max_split_size_mb:64,expandable_segments:True"
    )


def test_merge_override_collapses_duplicates_at_first_place():
    base = "max_split_size_mb:64,expandable_segments:True,max_split_size_mb:96"
    assert merge(base, max_split_size_mb=128) == (
        "max_split_size_mb:128,expandable_segments:True"
    )
    # Without an override, duplicates are kept: torch applies them in order.
    assert merge(base) == base


def test_merge_converts_python_values():
    assert merge(
        "",
        expandable_segments=True,
        max_split_size_mb=512,
        garbage_collection_threshold=0.6,
        roundup_power2_divisions={256: 1, 512: 2, ">": 8},
        pinned_num_register_threads="4",
    ) == (
        "expandable_segments:True,max_split_size_mb:512,"
        "garbage_collection_threshold:0.6,"
        "roundup_power2_divisions:[256:1,512:2,>:8],"
        "pinned_num_register_threads:4"
    )
    assert merge("", roundup_power2_divisions=[(256, 1), (">", 8)]) == (
        "roundup_power2_divisions:[256:1,>:8]"
    )


def test_merge_bad_override_names_key_and_offset():
    with pytest.raises(AllocConfError) as info:
        merge("expandable_segments:True", max_split_size_mb="x10")
    err = info.value
    assert (err.key, err.offset, err.text) == ("max_split_size_mb", 18, "x10")
    assert err.conf == "max_split_size_mb:x10"
    # Too small for the large segment size: a rule between keys, reported
    # in the merged string.
    with pytest.raises(AllocConfError) as info:
        merge("expandable_segments:True", max_split_size_mb=10)
    err = info.value
    assert (err.key, err.offset, err.text) == ("max_split_size_mb", 43, "10")
    assert err.conf == "expandable_segments:True,max_split_size_mb:10"
    with pytest.raises(AllocConfError, match="divisions must be 0 or a power"):
        merge("", roundup_power2_divisions={256: 3})


def test_merge_checks_rules_between_keys_in_the_result():
    with pytest.raises(AllocConfError) as info:
        merge("large_segment_size_mb:64", max_split_size_mb=32)
    err = info.value
    assert err.conf == "large_segment_size_mb:64,max_split_size_mb:32"
    assert (err.key, err.offset, err.text) == ("max_split_size_mb", 43, "32")


def test_merge_rejects_values_of_other_types():
    with pytest.raises(TypeError, match="max_split_size_mb: a value must be"):
        merge("", max_split_size_mb=object())


def test_merge_bad_base_raises():
    with pytest.raises(AllocConfError) as info:
        merge("max_split_size_mb:1", expandable_segments=True)
    assert info.value.key == "max_split_size_mb"


# -- round trips and torch's own verdict ------------------------------------


def _random_conf(rng):
    keys = [
        ("expandable_segments", lambda: rng.choice(["True", "False"])),
        ("max_split_size_mb", lambda: str(rng.randint(20, 1 << 20))),
        ("garbage_collection_threshold",
         lambda: "0." + str(rng.randint(1, 999))),
        ("roundup_power2_divisions", lambda: rng.choice([
            str(1 << rng.randint(0, 6)),
            "[" + ",".join([f"{1 << rng.randint(0, 12)}:{1 << rng.randint(0, 4)}"
                            for _ in range(rng.randint(0, 4))] + [">:1"]) + "]",
        ])),
        ("pinned_use_background_threads", lambda: rng.choice(["True", "False"])),
        ("max_non_split_rounding_mb", lambda: str(rng.randint(20, 4096))),
        ("some_future_key", lambda: rng.choice(["x", "[a:b,c]", "1.5"])),
    ]
    chosen = rng.sample(keys, rng.randint(0, len(keys)))
    sep = rng.choice([",", " , ", ",\t"])
    return sep.join(f"{k}{rng.choice([':', ' : '])}{v()}" for k, v in chosen)


CORPUS = VALID + [_random_conf(random.Random(seed)) for seed in range(200)]


@pytest.mark.parametrize("conf", CORPUS)
def test_round_trip(conf):
    canonical = merge(conf)
    assert parse(canonical) == parse(conf)
    assert merge(canonical) == canonical
    assert " " not in canonical


def test_torch_accepts_every_string_allocconf_produces():
    if not torch_facts()["getter"]:
        pytest.skip("needs torch 2.13+ (its setter keeps unknown keys, its "
                    "getter reads them back); older CUDA builds refuse "
                    "keys they do not know, by design")
    produced = set()
    for conf in CORPUS:
        produced.add(merge(conf))
        produced.add(merge(conf, expandable_segments=True))
        produced.add(merge(conf, expandable_segments=False))
    if not torch_facts()["keeps_unknown"]:
        # A CUDA build refuses keys it does not know (allocconf keeps
        # them, as a CPU build of torch does): only strings of its keys,
        # the reserve keys included only where this torch knows them.
        unknown = ["some_future_key"]
        if not torch_facts()["knows_reserve"]:
            unknown.append("expandable_segments_reserve")
        produced = {c for c in produced if not any(u in c for u in unknown)}
    produced = sorted(produced)
    verdicts = run_json(
        f"""
        import torch
        setter = torch._C._accelerator_setAllocatorSettings
        out = {{}}
        for conf in {produced!r}:
            try:
                # torch never resets large_segment_size_mb: start each
                # string from the default, as a fresh process would.
                setter("large_segment_size_mb:20")
                setter(conf)
                out[conf] = torch._C._accelerator_getAllocatorSettings() == conf
            except Exception as exc:
                out[conf] = repr(exc)
        print(json.dumps(out))
        """
    )
    refused = {k: v for k, v in verdicts.items() if v is not True}
    assert len(verdicts) == len(produced) > 100
    assert refused == {}


def test_module_exports_grammar_from_the_extension():
    assert allocconf.parse is allocconf._C.parse
    assert allocconf.merge is allocconf._C.merge
    assert json.loads(json.dumps(parse(VALID[6])))  # plain dict of str
