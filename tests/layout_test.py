"""The package's import graph: no module imports one that imports it back, and the rooms (the
subpackages and root modules of ragen_jax) stack in floors: no import runs back up."""

import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ragen_jax")


def _module(path: str) -> str:
  rel = os.path.relpath(path, os.path.dirname(PACKAGE))[: -len(".py")].replace(os.sep, ".")
  return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _target(name: str) -> str:
  """The module an imported dotted name lives in (`a.b.C` -> `a.b`)."""
  parts = name.split(".")
  root = os.path.dirname(PACKAGE)
  while parts and not (
      os.path.isfile(os.path.join(root, *parts) + ".py")
      or os.path.isdir(os.path.join(root, *parts))
  ):
    parts.pop()
  return ".".join(parts)


def _imports():
  """{module: project modules it imports}, function-level imports included."""
  out = {}
  for directory, _, files in os.walk(PACKAGE):
    for f in files:
      if not f.endswith(".py"):
        continue
      path = os.path.join(directory, f)
      names = set()
      for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
          names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
          names.update(f"{node.module}.{a.name}" for a in node.names)
      out[_module(path)] = {_target(n) for n in names if n.startswith("ragen_jax.")} - {"ragen_jax"}
  return out


def _cycles(edges):
  """Strongly connected groups of more than one node (Tarjan)."""
  index, low, stack, on, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in edges.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      group = set()
      while True:
        w = stack.pop()
        on.discard(w)
        group.add(w)
        if w == v:
          break
      if len(group) > 1:
        found.append(sorted(group))

  for v in list(edges):
    if v not in index:
      visit(v)
  return found


def _room(module: str) -> str:
  return ".".join(module.split(".")[:2])


def test_no_module_imports_one_that_imports_it_back():
  edges = _imports()
  assert len(edges) > 80  # the walk found the package
  assert _cycles(edges) == []


def test_rooms_stack_in_floors():
  edges = {}
  for module, targets in _imports().items():
    edges.setdefault(_room(module), set()).update(
        _room(t) for t in targets if _room(t) != _room(module)
    )
  assert _cycles(edges) == []
  # The configuration wing sits below the run, and only the commands sit above the run.
  assert not any(t.startswith("ragen_jax.train") for t in edges["ragen_jax.config"])
  above_train = {room for room, targets in edges.items() if "ragen_jax.train" in targets}
  assert above_train == {"ragen_jax.evaluate", "ragen_jax.export", "ragen_jax.serve_model"}


@pytest.mark.parametrize(
    "room, below",
    [
        ("ragen_jax.config", {"ragen_jax.train", "ragen_jax.evaluate"}),
        ("ragen_jax.warm_start", {"ragen_jax.train", "ragen_jax.config"}),
        ("ragen_jax.keys", {"ragen_jax.train", "ragen_jax.config", "ragen_jax.rollout"}),
    ],
)
def test_a_lower_room_imports_none_above_it(room, below):
  imported = set()
  for module, targets in _imports().items():
    if _room(module) == room:
      imported.update(_room(t) for t in targets)
  assert not imported & below, imported & below
