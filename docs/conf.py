"""Sphinx configuration: Markdown pages (MyST) and the API from docstrings.
Build: python -m sphinx -W -b html docs docs/_build/html"""
project = "allocconf"
author = "the allocconf authors"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
master_doc = "index"
exclude_patterns = ["_build"]
html_theme = "alabaster"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
myst_heading_anchors = 3
