"""The STAND-IN's allocator setter and getter (see torch/__init__.py)."""
CALLS = []     # every string handed to the setter, in order
REJECT = set()  # it refuses a string holding one of these, to test a refusal
_held = ""


def _accelerator_setAllocatorSettings(conf):
    global _held
    if not isinstance(conf, str):
        raise TypeError(f"stand-in setter: expected str, got "
                        f"{type(conf).__name__}")
    CALLS.append(conf)
    if any(r in conf for r in REJECT):
        raise ValueError(f"stand-in setter refused {conf!r}")
    _held = conf


def _accelerator_getAllocatorSettings():
    return _held
