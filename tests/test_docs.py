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


# -- What the docs and the comments cite ------------------------------------
#
# Every repository path a page or a source comment names must exist, every
# relative link of a page must lead somewhere, and no page or comment
# refers to an internal issue number or to a numbered list that is not
# there: a file moved or an issue closed leaves no stale pointer behind.

#: A path in the repository: a top-level folder, then at least one more
#: part (a bare "docs/" names the folder and is left alone).  A path
#: written as a pattern (test_*.py, <name>.md) is no single file: skipped.
_CITED_PATH = re.compile(
    r"(?<![\w./-])((?:csrc|python|tests|benchmarks|docs|tools|examples|fuzz)"
    r"/[\w./-]*[\w/]|allocconf/[\w/]+\.py)(?![*<{$])")

#: Paths cited that do not exist in a checkout, each with the reason.
_NOT_IN_A_CHECKOUT = {
    "docs/_build/html": "the Sphinx build's output (docs/conf.py)",
}


_INTERNAL_REF = re.compile(
    r"\b(?:[Ii]ssues?|PR)\s+#?\d+|(?<![\w&/])#\d+\b"
    r"|\b[Bb]ehaviou?rs?\s+\d+\b|\bitems?\s+\d+(?:\s*(?:,|and|-)\s*\d+)*\b")
#: Another project's issue, named with its project, is a citation.
_EXTERNAL_REF = re.compile(r"(?:vLLM|PyTorch|SGLang|Ray|CPython)\s+issues?\s")


_SOURCE_DIRS = ("csrc", "python", "tests", "benchmarks", "tools",
                "examples", "fuzz")


def _python_comments(text):
    """The comments and docstrings of a Python file."""
    import ast
    import io
    import tokenize
    out = [tok.string for tok in
           tokenize.generate_tokens(io.StringIO(text).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                             ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append(doc)
    return out


def _comments(path, text):
    if path.endswith(".py"):
        return _python_comments(text)
    if path.endswith((".c", ".h")):
        return re.findall(r"/\*.*?\*/|//[^\n]*", text, re.S)
    return re.findall(r"#[^\n]*", text)  # shell


def _source_files():
    for top in _SOURCE_DIRS:
        for path in sorted(glob.glob(os.path.join(ROOT, top, "**", "*"),
                                     recursive=True)):
            if path.endswith((".py", ".c", ".h", ".sh")):
                yield path
    yield os.path.join(ROOT, "setup.py")
    yield os.path.join(ROOT, ".ci", "run")


def _cited_texts():
    """(where, text) for every page and every source file's comments."""
    for page in PAGES:
        yield os.path.relpath(page, ROOT), _read(page)
    for path in _source_files():
        rel = os.path.relpath(path, ROOT)
        for text in _comments(path, _read(path)):
            yield rel, text


def missing_paths(texts, root=ROOT):
    """'where: path' for each repository path cited that does not exist."""
    out = []
    for where, text in texts:
        for m in _CITED_PATH.finditer(text):
            path = m.group(1)
            full = "python/" + path if path.startswith("allocconf/") else path
            if (full in _NOT_IN_A_CHECKOUT
                    or os.path.exists(os.path.join(root, full))):
                continue
            out.append(f"{where}: {path}")
    return out


def test_every_path_the_docs_and_comments_cite_exists():
    assert missing_paths(_cited_texts()) == []


def test_a_path_that_does_not_exist_is_named():
    texts = [("docs/x.md", "see csrc/api/gone.c, `benchmarks/gone.py`, "
              "allocconf/_gone.py and docs/design.md."),
             ("tests/x.py", "# the runs in tests/gpu/test_gone.py")]
    assert missing_paths(texts) == [
        "docs/x.md: csrc/api/gone.c", "docs/x.md: benchmarks/gone.py",
        "docs/x.md: allocconf/_gone.py",
        "tests/x.py: tests/gpu/test_gone.py"]


def test_no_page_or_comment_cites_an_internal_issue_or_a_missing_list():
    found = []
    for where, text in _cited_texts():
        for m in _INTERNAL_REF.finditer(text):
            before = text[max(0, m.start() - 12):m.start() + 8]
            if not _EXTERNAL_REF.search(before):
                found.append(f"{where}: {m.group(0)}")
    assert found == []


def test_the_issue_check_catches_what_it_must():
    for bad in ("(issue 25)", "issues 25 and 26", "see #12",
                "(behaviour 9)", "item 2"):
        assert _INTERNAL_REF.search(bad), bad
    for ok in ("vLLM issue 42609", "#include <x.h>", "fill: #4a7fb5",
               "issues/42609", "two items"):
        m = _INTERNAL_REF.search(ok)
        assert m is None or _EXTERNAL_REF.search(ok), ok


def _pages_with_links():
    results = glob.glob(os.path.join(ROOT, "benchmarks", "results", "*.md"))
    return PAGES + sorted(results)


def test_every_relative_link_of_a_page_leads_to_a_file():
    broken = []
    for page in _pages_with_links():
        for target in re.findall(r"\]\(([^)\s]+)\)", _read(page)):
            if re.match(r"[a-z]+:|#", target):
                continue
            path = os.path.join(os.path.dirname(page), target.split("#")[0])
            if not os.path.exists(path):
                broken.append(f"{os.path.relpath(page, ROOT)}: {target}")
    assert broken == []


def test_the_readme_says_why_the_ray_test_may_skip():
    readme = " ".join(_read(os.path.join(ROOT, "README.md")).split())
    assert "Ray is not in the test extras" in readme
    assert "`tests/transfer/test_transfer_ray.py` skips without it" in readme
    assert "`pip install ray`" in readme
    # ... and the test's skip says the same.
    ray_test = _read(os.path.join(TESTS_DIR, "transfer",
                                  "test_transfer_ray.py"))
    assert 'importorskip("ray"' in ray_test
