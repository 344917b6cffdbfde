"""Sphinx configuration of the ragen_jax documentation (Markdown pages through MyST).

Build: sphinx-build -W --keep-going -b html docs docs/_build/html
"""

import os
import re
import sys

from absl import flags as absl_flags

# The package of this checkout, whether or not it is installed.
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

project = "ragen_jax"
author = "ragen_jax authors"
copyright = "ragen_jax authors"  # pylint: disable=redefined-builtin

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]
templates_path = ["_templates"]

html_theme = "furo"
html_title = "ragen_jax"

# MyST: headings get anchors down to level 4, so `page.md#heading` links are checked, and a
# link to a missing file or anchor is a warning (an error under -W).
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

# Docstrings: Google style; `name` in a docstring is code.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# A class's "Attributes:" as fields, not as attribute entries that would describe a dataclass
# field a second time beside autodoc's own entry for it.
napoleon_use_ivar = True
default_role = "code"

# The API reference follows the package's layout when it is built: autosummary walks
# ragen_jax recursively (docs/api.md) and writes one page per module (docs/_autosummary/).
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {
    "members": True,
    "show-inheritance": True,
    "member-order": "bysource",
}
autodoc_typehints = "description"
autodoc_class_signature = "separated"

# The command-line modules (evaluate, export, ...) define absl flags when imported, some under
# the same name (--checkpoint); the docs build imports them all into one process, so a later
# definition replaces an earlier one here instead of raising DuplicateFlagError.
_set_flag = absl_flags.FlagValues.__setitem__


def _set_flag_allowing_override(self, name, flag):
  flag.allow_override = True
  _set_flag(self, name, flag)


absl_flags.FlagValues.__setitem__ = _set_flag_allowing_override

# The package's docstrings are Google style written as plain text: tables and code are indented
# blocks under a line of prose, `|x|` is an absolute value and `*` a product. Before napoleon reads
# them, each such block becomes a literal block, and `|` and a `*` that opens no emphasis are
# escaped, so that they render as written.
_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Keyword Args|Keyword Arguments|Other Parameters|Returns?|"
    r"Yields?|Raises|Attributes|Methods|Examples?|Notes?|Warnings?|See Also|Todo|References)"
    r":\s*$"
)
_LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d+[.)]|\(\d+\))\s+")
_SPAN = re.compile(r"(``.+?``|`[^`]+`)")
_TRAILING_UNDERSCORE = re.compile(r"(\w)_(?!\w)")  # `name_` is a link in RST, not in prose
_EMPHASIS = re.compile(r"(?<![\w*\\])\*[^\s*][^*]*?(?<![\s\\])\*(?![\w*])")


def _indent(line):
  return len(line) - len(line.lstrip())


def _escape_prose(text):
  """Escapes `|`, a stray `*` and a trailing `_` outside inline code; code followed by a letter stays code."""
  parts = _SPAN.split(text)
  for i, part in enumerate(parts):
    if i % 2:  # inline code: `x`s -> `x`\ s, so that the code span ends where it should
      if i + 1 < len(parts) and parts[i + 1][:1].isalnum():
        parts[i + 1] = "\\ " + parts[i + 1]
      continue
    kept = _EMPHASIS.findall(part)
    pieces = _EMPHASIS.split(part)
    pieces = [_TRAILING_UNDERSCORE.sub(r"\1\\_", p.replace("|", "\\|")) for p in pieces]
    pieces = [p.replace("*", "\\*") for p in pieces]
    parts[i] = "".join(p + (kept[j] if j < len(kept) else "") for j, p in enumerate(pieces))
  return "".join(parts)


def _plain_text_to_rst(lines):
  out = []
  prev = None  # the previous non-blank line outside a block
  blank = False  # whether a blank line came since it
  block = None  # inside an indented block: the indent it must exceed, and whether it is literal
  for line in lines:
    if not line.strip():
      out.append(line)
      blank = True
      continue
    indent = _indent(line)
    if block is not None:
      if indent > block[0]:
        out.append(line if block[1] else _escape_prose(line))
        blank = False
        continue
      if not blank:
        out.append("")
      block = None
    if prev is not None and indent > _indent(prev):
      item = _LIST_ITEM.match(prev)
      if _SECTION.match(prev) or prev.lstrip().startswith(".."):
        block = (_indent(prev), False)  # napoleon's section or a directive: prose
      elif prev.rstrip().endswith("::"):
        block = (_indent(prev), True)
      elif item and indent == item.end():
        pass  # a list item's continuation
      else:  # an indented table or example under prose: a literal block
        block = (_indent(prev), True)
        if blank:
          out.extend([" " * _indent(prev) + "::", ""])
        else:
          last = out[-1]
          out[-1] = last + (":" if last.rstrip().endswith(":") else " ::")
          out.append("")
      if block is not None:
        out.append(line if block[1] else _escape_prose(line))
        blank = False
        continue
    out.append(_escape_prose(line))
    prev, blank = line, False
  lines[:] = out


def _process_docstring(app, what, name, obj, options, lines):
  del app, what, name, obj, options
  _plain_text_to_rst(lines)


def setup(app):
  app.connect("autodoc-process-docstring", _process_docstring, priority=100)
