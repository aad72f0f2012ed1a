"""The library's import graph has no circle: read from the source (every `import` and
`from ... import`, those inside functions too), so a lazy import cannot hide one. An import
of `a.b.c` is an edge to module `a.b.c` (to package `a.b`'s `__init__` when `c` is a name
in it, not a module)."""
import ast
import os

from absl.testing import absltest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "jaxrl_llm"


def modules() -> dict[str, str]:
  """{module name: its file} of every module of the package."""
  found = {}
  for folder, _, files in os.walk(os.path.join(ROOT, PACKAGE)):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        found[module.removesuffix(".__init__")] = path
  return found


def imports(module: str, path: str, known: dict[str, str]) -> set[str]:
  """The package's modules that `module` imports anywhere in its file."""
  package = module if path.endswith("__init__.py") else module.rpartition(".")[0]

  def known_prefix(name: str) -> str | None:
    while name and name not in known:
      name = name.rpartition(".")[0]
    return name or None

  found = set()
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(known_prefix(a.name) for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative: from the package `level - 1` above this module's
        parts = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([node.module] if node.module else []))
      for a in node.names:
        full = f"{base}.{a.name}"
        found.add(full if full in known else known_prefix(base))
  return {m for m in found if m and m.startswith(PACKAGE) and m != module}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan's algorithm,
  iterative)."""
  index, low, on_stack, stack, found = {}, {}, set(), [], []
  for root in graph:
    if root in index:
      continue
    work = [(root, iter(sorted(graph[root])))]
    index[root] = low[root] = len(index)
    stack.append(root)
    on_stack.add(root)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is None:
        work.pop()
        if work:
          low[work[-1][0]] = min(low[work[-1][0]], low[node])
        if low[node] == index[node]:
          component = []
          while True:
            member = stack.pop()
            on_stack.discard(member)
            component.append(member)
            if member == node:
              break
          if len(component) > 1:
            found.append(sorted(component))
      elif child not in index:
        index[child] = low[child] = len(index)
        stack.append(child)
        on_stack.add(child)
        work.append((child, iter(sorted(graph[child]))))
      elif child in on_stack:
        low[node] = min(low[node], index[child])
  return found


class ImportGraphTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    known = modules()
    cls.graph = {m: imports(m, path, known) for m, path in known.items()}

  def test_no_import_circle(self):
    self.assertEqual(circles(self.graph), [])

  def test_rewards_import_nothing_of_training(self):
    for module, targets in self.graph.items():
      if module.startswith(f"{PACKAGE}.rewards"):
        self.assertEqual({t for t in targets if t.startswith(f"{PACKAGE}.training")}, set(),
                         module)

  def test_the_reader_finds_a_circle_through_a_lazy_import(self):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    self.assertEqual(circles(graph), [["a", "b", "c"]])
    self.assertIn(f"{PACKAGE}.training.setup",  # a module-level import
                  self.graph[f"{PACKAGE}.training.loop"])
    self.assertIn(f"{PACKAGE}.sampling",  # one inside a function (_check_admission)
                  self.graph[f"{PACKAGE}.config.env_checks"])


if __name__ == "__main__":
  absltest.main()
