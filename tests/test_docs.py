"""The docs quote allocconf's messages as the code gives them.

Each message the docs quote (a ``>>>`` example followed by the error it
raises, or a backquoted ``allocconf: ...`` / ``AllocConf...: ...`` text)
is checked against what allocconf says or against the texts in its
source, so that a reworded message cannot leave a stale quote behind.
"""
import glob
import os
import re

import pytest

from helpers import TESTS_DIR, run_json

ROOT = os.path.dirname(TESTS_DIR)
PAGES = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [
    os.path.join(ROOT, "README.md")]


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _examples():
    """(page, expression, quoted error) for each ``>>> expr`` line followed
    by an ``AllocConfError: ...`` line."""
    out = []
    for page in PAGES:
        lines = _read(page).splitlines()
        for i, line in enumerate(lines[:-1]):
            nxt = lines[i + 1]
            if line.startswith(">>> ") and nxt.startswith("AllocConfError: "):
                out.append((os.path.basename(page), line[4:],
                            nxt[len("AllocConfError: "):]))
    return out


EXAMPLES = _examples()


def test_the_pages_hold_examples_to_check():
    assert EXAMPLES, "no >>> example with its AllocConfError found"


@pytest.mark.parametrize("page, expr, quoted", EXAMPLES,
                         ids=[e[1] for e in EXAMPLES])
def test_quoted_errors_are_what_allocconf_raises(page, expr, quoted):
    out = run_json(f"""
        import allocconf
        try:
            {expr}
            got = None
        except allocconf.AllocConfError as exc:
            got = str(exc)
        print(json.dumps(got))
    """)
    assert out == quoted, page


def _quoted_texts():
    texts = set()
    for page in PAGES:
        for t in re.findall(r"`((?:allocconf|AllocConf\w+): [^`]+)`",
                            _read(page)):
            texts.add(t)
    return sorted(texts)


def _fixed_parts(text):
    """The parts of a quoted message that are no placeholder ('...',
    '<key>', 'N'), as the source must spell them."""
    text = re.sub(r"^AllocConf\w+: ", "", text)
    parts = re.split(r"'?\.\.\.'?|<[^>]+>|\bN\b", text)
    return [p.strip(" :") for p in parts if len(p.strip(" :")) >= 6]


def test_quoted_message_texts_are_in_the_source():
    sources = "".join(
        _read(f) for f in glob.glob(os.path.join(ROOT, "csrc", "**", "*.c"),
                                    recursive=True)
        + glob.glob(os.path.join(ROOT, "python", "allocconf", "*.py")))
    # C strings split across lines are joined, as the compiler does.
    flat = re.sub(r'"\s*\n\s*"', "", sources)
    texts = _quoted_texts()
    assert texts
    missing = [(t, part) for t in texts for part in _fixed_parts(t)
               if part not in flat and part.replace("allocconf: ", "")
               not in flat]
    assert missing == []


def test_the_readme_says_why_the_ray_test_may_skip():
    readme = " ".join(_read(os.path.join(ROOT, "README.md")).split())
    assert "Ray is not in the test extras" in readme
    assert "`tests/test_transfer_ray.py` skips without it" in readme
    assert "`pip install ray`" in readme
    # ... and the test's skip says the same.
    ray_test = _read(os.path.join(TESTS_DIR, "test_transfer_ray.py"))
    assert 'importorskip("ray"' in ray_test
