"""The test suite's own rule: pytest-xdist runs many test modules in one
process, and every bertjax binary defines ``--config`` on absl's global
flags, so importing two binaries in-process fails (DuplicateFlagError) in
whichever worker happens to get both. At most one binary may be imported by
the tests in-process; the others are run as subprocesses."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _binaries() -> set[str]:
  """Modules of bertjax that define absl flags when imported."""
  found = set()
  for path in (ROOT / "bertjax").rglob("*.py"):
    if path.name == "config_files.py":
      continue  # the helper the binaries call, defining nothing itself
    text = path.read_text()
    if "flags.DEFINE" in text or "define_config_flag(" in text:
      found.add(".".join(path.relative_to(ROOT).with_suffix("").parts))
  return found


def _imported(tree: ast.AST) -> set[str]:
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      names.add(node.module)
      names.update(f"{node.module}.{alias.name}" for alias in node.names)
  return names


def test_the_tests_import_at_most_one_binary_in_process():
  binaries = _binaries()
  assert {"bertjax.prepare", "bertjax.aot", "bertjax.main"} <= binaries, binaries
  importers = {}
  for path in sorted((ROOT / "tests").glob("*.py")):
    for name in _imported(ast.parse(path.read_text())) & binaries:
      importers.setdefault(name, []).append(path.name)
  assert len(importers) <= 1, (
      f"binaries imported in-process by the tests: {importers}; run all but "
      f"one of them in a subprocess (their --config flags collide)")
