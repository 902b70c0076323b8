"""A STAND-IN for torch, for the Pythons CI has no torch build for.

Not torch: a module named ``torch`` with the few things allocconf asks of
it (a version, a CUDA build's ``version.cuda``, the 2.10+ setter and the
2.13+ getter), so that allocconf's hook, windows, locks and fork handling
run on Python 3.9 to 3.13.  The setter only refuses what is not a str and
strings holding a text in ``_C.REJECT``; it keeps the last string, as
torch's getter shows.
What real torch does with a string is proven by the suite on torch itself.
Put this directory first on sys.path to use it.
"""
from types import SimpleNamespace

from torch import _C  # noqa: F401

__version__ = "0.0+standin"
STANDIN = True
version = SimpleNamespace(cuda="13.0", hip=None)
