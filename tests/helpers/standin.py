"""A stand-in `torch` module for child scripts: only a version, a build
and a setter, so that allocconf's decisions from torch's build (ROCm
versions, older setters, no setter) are tested without pretending a GPU."""
from helpers import run_json


def stand_in(version, cuda=None, hip=None,
             setter="_accelerator_setAllocatorSettings", call="calls.append"):
    """Child-script text: a stand-in `torch` with `setter` (calling `call`,
    which records into `calls` by default), then `import allocconf`, its
    warnings kept in `caught`."""
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
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import allocconf
"""


def decide(version, cuda=None, hip=None,
           setter="_accelerator_setAllocatorSettings", env=None, warns=0):
    """What allocconf did with a stand-in torch: the setter calls and
    status(); the `warns` warnings given at import in "warnings" (any
    other number fails)."""
    out = run_json(stand_in(version, cuda, hip, setter), """
        print(json.dumps({"calls": calls,
                          "status": allocconf.status().as_dict(),
                          "warnings": [str(w.message) for w in caught]}))
    """, env=env)
    assert len(out["warnings"]) == warns, out["warnings"]
    return out
