"""The C heap in use, from glibc's mallinfo2(): what the leak tests
measure (tracemalloc sees only Python's own allocator)."""
import ctypes

_libc = ctypes.CDLL(None)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
        "fsmblks", "uordblks", "fordblks", "keepcost")]


_libc.mallinfo2.restype = _MallInfo2
_libc.malloc.restype = ctypes.c_void_p


def in_use():
    """Bytes malloc has handed out and not had back (mmapped included)."""
    info = _libc.mallinfo2()
    return info.uordblks + info.hblkhd


def leak(nbytes):
    """Allocate and never free `nbytes`: a planted leak for the tests."""
    _libc.malloc(nbytes)
