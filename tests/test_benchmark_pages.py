"""The benchmarks page is written from the benchmarks' JSON (run_all.py,
plot_ipc_sync.py): a record as ipc_sync.py saves it must come out as the
table rows and plot bars it holds, a failed approach as a failure, so a
renamed key fails here rather than on the GPU machine after a long run."""
import json
import os
import re
import sys
import xml.dom.minidom

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "benchmarks"),
                os.path.join(ROOT, "benchmarks", "transfer")]

import run_all  # noqa: E402
from plot_ipc_sync import svg  # noqa: E402


def approach(warm, copies, correct=True, limit=4.0):
    return {"cold_ms": 40.0, "warm_ms": warm, "warm_all_ms": [],
            "extra_gib": 2.0, "correct": correct, "copies": copies,
            "shared_ipc_capable": True,
            **({"warm_over_copy_limit": warm / limit,
                "warm_over_own_floor": warm / limit / copies}
               if warm is not None else {})}


def record(model, nobody=False):
    return {"machine": {"gpu": "GPU X", "torch": "2.11.0"}, "gib": 8.0,
            "model": model, "as_nobody": nobody, "tensors": 512,
            "capacity_mib": 1024, "buffers": 2, "memcpy_from": 1 << 25,
            "receiver_device": -1,
            "approaches": {
                "direct": (approach(None, 1, "RuntimeError: pidfd_getfd: "
                                    "Operation not permitted")
                           if nobody else approach(27.2, 1)),
                "transfer": approach(15.6, 2)},
            "summary": {"copy_gbps": 2000.0, "copy_limit_ms": 4.0,
                        "foreach_copy_ms": 6.0}}


def test_the_ipc_sync_tables_hold_each_figure(tmp_path):
    for name, rec in (("ipc_sync_uniform", record("uniform")),
                      ("ipc_sync_uniform_nobody", record("uniform", True))):
        (tmp_path / f"{name}.json").write_text(json.dumps(rec))
    text = run_all.page(str(tmp_path), {"ipc_sync": "printed line\n{}"},
                        "cmd")
    assert "| transfer | 40.0 | 15.6 | 3.90x | 1.95x | 2.00 | True |" in text
    assert "| direct | 40.0 | 27.2 | 6.80x | 6.80x | 2.00 | True |" in text
    assert ("| direct | 40.0 | - | - | - | 2.00 | RuntimeError: "
            "pidfd_getfd: Operation not permitted |") in text
    assert "### uniform, 8.00 GiB in 512 tensors, as an unprivileged user" \
        in text
    assert "printed line" in text and "\n{}" not in text  # JSON line left out


def test_the_plot_has_a_bar_per_sync_and_names_a_failure():
    doc = xml.dom.minidom.parseString(
        svg([record("uniform"), record("llama8b", nobody=True)]))
    texts = [t.firstChild.data for t in doc.getElementsByTagName("text")]
    bars = [r for r in doc.getElementsByTagName("rect")
            if r.getAttribute("fill") != "white"]
    assert len(bars) == 3  # direct and transfer, then transfer alone
    assert "failed" in texts
    assert "15.6 (3.9x)" in texts and "27.2 (6.8x)" in texts
    widths = sorted(float(b.getAttribute("width")) for b in bars)
    assert widths[0] == widths[1] < widths[2]  # 15.6, 15.6, 27.2 ms


def test_copy_methods_rows(tmp_path):
    rec = {"machine": {}, "uniform": {"tensors": 512, "gib": 8.0, "methods": {
        "copy_": {"ms": 5.66, "gbps": 1519.4}}}}
    (tmp_path / "copy_methods.json").write_text(json.dumps(rec))
    text = run_all.page(str(tmp_path), {}, "cmd")
    assert "| uniform | copy_ | 5.66 | 1519 |" in text


@pytest.mark.parametrize("argv", [["plot_ipc_sync.py"],
                                  ["plot_ipc_sync.py", "out.svg"]])
def test_the_plot_script_says_how_to_use_it(argv, monkeypatch):
    import plot_ipc_sync

    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit, match="Usage: python benchmarks/"
                       "transfer/plot_ipc_sync.py OUT.svg RESULT.json"):
        plot_ipc_sync.main()


def sweep_part(tmp_path, name, runs, gpu="GPU X"):
    path = tmp_path / name / "ipc_sync.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"machine": {"gpu": gpu, "torch": "2.11.0"},
                                "runs": runs}))
    return str(path)


def sized(model, gib):
    r = record(model)
    r["gib"] = gib
    r["fits_buffers"] = gib <= 2
    r["approaches"]["transfer"]["trainer_ms"] = 5.0
    return r


def test_a_sweep_run_in_parts_is_merged_into_one_table_and_plot(
        tmp_path, monkeypatch, capsys):
    import ipc_sweep

    small = sweep_part(tmp_path, "a", [sized("uniform", 2.0),
                                       sized("uniform", 0.1)])
    large = sweep_part(tmp_path, "b", [sized("llama8b", 15.0),
                                       sized("uniform", 8.0)])
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["ipc_sweep.py", "--out", str(out),
                                      "--merge", large, small])
    ipc_sweep.main()
    saved = json.loads((out / "ipc_sync.json").read_text())
    assert [(r["model"], r["gib"]) for r in saved["runs"]] == [
        ("uniform", 0.1), ("uniform", 2.0), ("uniform", 8.0),
        ("llama8b", 15.0)]
    assert saved["machine"]["gpu"] == "GPU X"
    assert saved["parts"] == [large, small]
    rows = [ln for ln in capsys.readouterr().out.splitlines()
            if ln.startswith("| ") and not ln.startswith("| weights")]
    assert [ln.split(" | ")[0] for ln in rows] == [
        "| 0.1 GiB", "| 2.0 GiB", "| 8.0 GiB", "| llama8b"]
    assert "| 15.60 | 1.95x | 5.00 (1.25x) |" in rows[1]  # fits
    assert "(1.25x, buffers reused)" in rows[2]
    doc = xml.dom.minidom.parse(str(out / "ipc_sync.svg"))
    bars = [r for r in doc.getElementsByTagName("rect")
            if r.getAttribute("fill") != "white"]
    assert len(bars) == 8  # direct and transfer in each of the four runs


@pytest.mark.parametrize("bad", ["other gpu", "not a sweep", "no parts",
                                 "a part twice"])
def test_a_merge_refuses_parts_that_are_not_one_sweep(tmp_path, monkeypatch,
                                                      bad):
    import ipc_sweep

    one = sweep_part(tmp_path, "a", [sized("uniform", 1.0)])
    if bad == "other gpu":
        other = sweep_part(tmp_path, "b", [sized("uniform", 8.0)],
                           gpu="GPU Y")
        match = (f"{re.escape(other)} was measured on .*GPU Y.*"
                 f"{re.escape(one)} on .*GPU X")
    elif bad == "not a sweep":
        other = str(tmp_path / "record.json")
        (tmp_path / "record.json").write_text(json.dumps(record("uniform")))
        match = f"{re.escape(other)} is not a sweep's ipc_sync.json"
    elif bad == "a part twice":
        other = one
        match = (f"{re.escape(one)} and {re.escape(one)} both hold the "
                 f"run of uniform 1 GiB")
    else:
        one = other = None
        match = "--merge needs the ipc_sync.json files"
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["ipc_sweep.py", "--out", str(out),
                                      "--merge"]
                        + [p for p in (one, other) if p])
    with pytest.raises(SystemExit, match=match):
        ipc_sweep.main()
    assert not out.exists()  # nothing half-written


def test_every_script_run_all_runs_is_where_it_looks():
    # run_all.py finds each script in its folder (core/ or transfer/): a
    # script moved or renamed must fail here, not after a GPU run.
    for name, folder in run_all.FOLDER.items():
        assert os.path.isfile(os.path.join(ROOT, "benchmarks", folder,
                                           f"{name}.py")), name
