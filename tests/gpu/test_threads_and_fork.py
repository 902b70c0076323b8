"""Windows from many threads while others allocate, and
fork after activation."""
import pytest

from helpers import run_json

pytestmark = pytest.mark.gpu


def test_allocations_inside_windows_are_classic_across_threads():
    out = run_json("""
        import random, threading
        import allocconf, torch
        from helpers.gpu import alloc, expandable, last_string
        alloc(1)
        before = last_string()
        inside, outside, errors = [], [], []
        start = threading.Barrier(12)

        def window_thread(seed):
            rng = random.Random(seed)
            start.wait()
            for _ in range(40):
                with allocconf.ipc_safe():
                    if rng.random() < 0.5:
                        with allocconf.ipc_safe():
                            inside.append(alloc(rng.randint(1, 8)))
                    inside.append(alloc(rng.randint(1, 8)))

        def outside_thread(seed):
            rng = random.Random(seed)
            start.wait()
            for _ in range(60):
                outside.append(alloc(rng.randint(1, 8)))

        threads = [threading.Thread(target=window_thread, args=(i,))
                   for i in range(8)]
        threads += [threading.Thread(target=outside_thread, args=(i,))
                    for i in range(100, 104)]
        for t in threads: t.start()
        for t in threads: t.join(timeout=300)
        torch.cuda.synchronize()
        print(json.dumps({
            "alive": sum(t.is_alive() for t in threads),
            "inside": len(inside),
            "inside_expandable": sum(expandable(t) for t in inside),
            "outside": len(outside),
            "before": before, "after": last_string(),
            "depth": allocconf.status().window_depth}))
    """, timeout=600)
    assert out["alive"] == 0
    assert out["inside"] >= 8 * 40
    assert out["inside_expandable"] == 0
    assert out["outside"] == 4 * 60
    assert out["after"] == out["before"]
    assert out["depth"] == 0


def test_fork_after_activation_child_can_allocate():
    out = run_json("""
        import allocconf, torch
        from helpers.harness import forked
        assert allocconf.status().applied
        parent_initialized = torch.cuda.is_initialized()
        def child():
            from helpers.gpu import alloc, expandable
            t = alloc(16)
            t.fill_(7)
            return int(t[123].item()) == 7 and expandable(t)
        code, ok = forked(child, timeout=240)
        print(json.dumps({"parent_initialized": parent_initialized,
                          "child_exit": code, "ok": ok}))
    """, timeout=300)
    assert out == {"parent_initialized": False, "child_exit": 0, "ok": True}
