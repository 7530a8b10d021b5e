"""Imports point one way, and the folder layout is the architecture (docs/architecture.md).

Layers, bottom first: ``errors`` → ``core`` → ``storage`` → ``read`` | ``packing`` → the public
face (``bundlefs/__init__.py``) → ``mount`` | ``integrations`` → ``cli`` → ``demo`` and
``__main__``. A module imports only from its own package or from a lower layer; ``read`` and
``packing`` are siblings that never import each other.
The library works where pyfuse3 and trio are not even installed.

Every import is an edge of the module graph: at module level, inside a function, and under
``if TYPE_CHECKING:`` alike (a type checker follows them all, and a circle among them is a circle
in the design). ``from bundlefs.x import y`` is an edge to the module ``bundlefs.x.y`` where there
is one, else to ``bundlefs.x`` (its ``__init__.py``).

**Order inside a package.** A package's ``__init__.py`` docstring states the order of its children
(its modules and sub-packages, by name without ``.py``), bottom first::

    Order (bottom first): location | marker | codec, index | shards, publish, objectstore

Commas separate levels, bottom first; ``|`` joins siblings of one level (as ``read | packing``
above), which never import each other. The line may wrap onto the following lines of the
docstring; it ends at a blank line. A module imports only children of its package listed on a
lower level; a sub-package counts as one child (its own ``__init__.py`` orders its inside). The
``__init__.py`` itself sits above every child (it re-exports them), so no child imports it. Every
child is listed exactly once. The top package's order is ``LAYERS`` below.

**Size budget.** A module is at most 400 lines, a class at most 300, a function at most 60. An
argparse option table is exempt: a function whose every statement (after its docstring) is a call
of ``add_argument``, ``add_argument_group``, ``add_mutually_exclusive_group``, ``add_parser`` or
``set_defaults``, alone or assigned to a name.

**Allow-lists only shrink.** What is over budget today (``OVER_BUDGET``), the import circles not yet
opened (``KNOWN_CIRCLES``) and the packages whose order is not written yet
(``PACKAGES_WITHOUT_ORDER``) are listed explicitly. A listed item must still be exactly as listed:
the test fails when it is gone, within budget or smaller than listed (delete or lower the entry),
and when anything unlisted goes over.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import bundlefs

PACKAGE = Path(bundlefs.__file__).parent

# package (below bundlefs) -> layer; a module may import a package whose layer is lower, or its own.
LAYERS = {
    "errors": 0,
    "_fuse3": 0,  # the patched pyfuse3 setup.py compiles (no source here; imports nothing of ours)
    "core": 1,
    "storage": 2,
    "read": 3,
    "packing": 3,
    "__init__": 4,  # the library's public face: Bundle, pack, the errors
    "mount": 5,
    "integrations": 5,  # fsspec, torch: adapters over the public face, beside the FUSE adapter
    "cli": 6,
    "demo": 7,
    "__main__": 7,
}

_BLOCK_FUSE = """
import sys
class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pyfuse3", "trio"):
            raise ImportError(f"{name} is blocked in this test")
        return None
sys.meta_path.insert(0, _Blocker())
"""


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _package_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(module name, at module level) for every import in ``path``."""
    tree = ast.parse(path.read_text())
    top_level = set(map(id, tree.body))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: use absolute imports (from bundlefs.x import y)"
            found.append((node.module or "", id(node) in top_level))
    return found


def _bundlefs_package(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "bundlefs":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


# -- the module graph -----------------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in _modules()}


def _place(module: str) -> tuple[str, ...]:
    """A module's folders below bundlefs/, then its file name (``__init__`` for a package's own)."""
    return MODULES[module].relative_to(PACKAGE).with_suffix("").parts


def _edges(path: Path) -> set[str]:
    """The bundlefs modules ``path`` imports: at module level, in functions, under TYPE_CHECKING."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in MODULES else node.module)
    return found & MODULES.keys()  # bundlefs._fuse3 is compiled: no source, imports nothing of ours


GRAPH = {module: _edges(path) for module, path in MODULES.items()}


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_imports_only_its_own_layer_or_below(path):
    own = _package_of(path)
    assert own in LAYERS, f"{path}: add its package to LAYERS and docs/architecture.md"
    for target in sorted(GRAPH[_module_name(path)]):
        other = _place(target)[0]
        if other == own:
            continue
        assert LAYERS[other] < LAYERS[own], f"{path.name} ({own}) imports {target}"


# -- order inside a package -----------------------------------------------------------------------

# Packages whose __init__.py states no order yet. It may only shrink: once a package states its
# order, delete it here (the test says so).
PACKAGES_WITHOUT_ORDER: set[str] = set()

_ORDER = re.compile(r"Order \(bottom first\):(.*?)(?:\n\s*\n|\Z)", re.DOTALL)
PACKAGES = sorted(
    path.parent.relative_to(PACKAGE).as_posix()
    for path in PACKAGE.rglob("__init__.py")
    if path.parent != PACKAGE and "__pycache__" not in path.parts
)


def _children(package: str) -> set[str]:
    folder = PACKAGE / package
    modules = {path.stem for path in folder.glob("*.py") if path.name != "__init__.py"}
    return modules | {path.parent.name for path in folder.glob("*/__init__.py")}


def _order(package: str) -> dict[str, int] | None:
    """Child name -> level (0 at the bottom), from the package docstring's "Order" line."""
    docstring = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text()))
    match = _ORDER.search(docstring or "")
    if match is None:
        return None
    levels: dict[str, int] = {}
    for level, siblings in enumerate(match.group(1).strip().rstrip(".").split(",")):
        for name in siblings.split("|"):
            name = name.strip().strip("`")
            assert name not in levels, f"{package}/__init__.py: {name} is listed twice"
            levels[name] = level
    return levels


ORDERS = {package: _order(package) for package in PACKAGES}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_orders_each_of_its_modules_once(package):
    order = ORDERS[package]
    if package in PACKAGES_WITHOUT_ORDER:
        assert order is None, f"{package} states its order: delete it from PACKAGES_WITHOUT_ORDER"
        return
    assert order is not None, f"{package}/__init__.py: state its order (see this test's docstring)"
    children = _children(package)
    assert not children - order.keys(), f"{package}: not in its order: {children - order.keys()}"
    assert not order.keys() - children, f"{package}: no such modules: {order.keys() - children}"


def _import_against_order(source: str, target: str) -> str | None:
    """Why importing ``target`` breaks the order of the package both are in, or None."""
    mine, theirs = _place(source), _place(target)
    depth = 0
    while mine[depth] == theirs[depth]:
        depth += 1
    package = "/".join(mine[:depth])
    order = ORDERS.get(package)
    if depth == 0 or order is None or mine[depth] == "__init__":
        return None  # the top package's order is LAYERS; an unordered package fails on its own
    if theirs[depth] == "__init__":
        return f"{source} imports {target}, its package's __init__ (which sits above its modules)"
    low, high = order.get(theirs[depth]), order.get(mine[depth])
    if low is None or high is None or low >= high:
        below, above = theirs[depth], mine[depth]
        return f"{source} imports {target}: {package}'s order does not put {below} below {above}"
    return None


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_imports_only_modules_below_it_in_its_package(path):
    source = _module_name(path)
    wrong = [_import_against_order(source, target) for target in sorted(GRAPH[source])]
    assert not any(wrong), "\n".join(filter(None, wrong))


# -- circles --------------------------------------------------------------------------------------

# Import circles not yet opened. It may only shrink: the test fails once one of them is gone.
KNOWN_CIRCLES: list[set[str]] = []


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected parts of ``graph`` with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            part = set()
            while not part or node not in part:
                part.add(stack.pop())
            if len(part) > 1 or node in graph[node]:
                found.append(part)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_circle_finder_finds_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "d"}, "e": set()}
    assert sorted(map(sorted, _circles(graph))) == [["a", "b", "c"], ["d"]]


def test_no_import_circle_but_the_known_ones():
    new = [sorted(circle) for circle in _circles(GRAPH) if circle not in KNOWN_CIRCLES]
    assert not new, f"import circles (TYPE_CHECKING and function imports count): {new}"


def test_every_known_circle_still_exists():
    circles = _circles(GRAPH)
    opened = [sorted(circle) for circle in KNOWN_CIRCLES if circle not in circles]
    assert not opened, f"no longer a circle (or a different one): edit KNOWN_CIRCLES: {opened}"


# -- size budget ----------------------------------------------------------------------------------

MODULE_LINES, CLASS_LINES, FUNCTION_LINES = 400, 300, 60
_OPTION_TABLE_CALLS = {
    "add_argument",
    "add_argument_group",
    "add_mutually_exclusive_group",
    "add_parser",
    "set_defaults",
}

# What is over budget today, as "path" (a module), "path:Class" or "path:function" (qualified:
# "path:Class.method") -> lines. It may only shrink: the test fails once an entry is within budget
# or smaller than listed (lower it or delete it), and when anything grows or goes over unlisted.
OVER_BUDGET: dict[str, int] = {}


def _is_option_table(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring

    def option_call(node: ast.expr) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _OPTION_TABLE_CALLS
        )

    return bool(body) and all(
        isinstance(statement, ast.Expr | ast.Assign) and option_call(statement.value)
        for statement in body
    )


def _over_budget() -> dict[str, int]:
    """Every module, class and function over its budget -> its lines."""
    over: dict[str, int] = {}
    for path in _modules():
        name = path.relative_to(PACKAGE.parent).as_posix()
        text = path.read_text()
        if len(text.splitlines()) > MODULE_LINES:
            over[name] = len(text.splitlines())
        pending: list[tuple[ast.AST, str]] = [(ast.parse(text), "")]
        while pending:
            node, prefix = pending.pop()
            for child in ast.iter_child_nodes(node):
                if not isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    pending.append((child, prefix))
                    continue
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                key = f"{name}:{prefix}{child.name}"
                if isinstance(child, ast.ClassDef):
                    too_big = lines > CLASS_LINES
                else:
                    too_big = lines > FUNCTION_LINES and not _is_option_table(child)
                if too_big:
                    over[key] = max(lines, over.get(key, 0))
                pending.append((child, f"{prefix}{child.name}."))
    return over


def test_the_option_table_rule_exempts_only_option_tables():
    table = ast.parse(
        "def f(p):\n    'Doc.'\n    g = p.add_argument_group('x')\n    g.add_argument('-a')"
    )
    logic = ast.parse("def f(p):\n    p.add_argument('-a')\n    print(p)")
    assert _is_option_table(table.body[0])
    assert not _is_option_table(logic.body[0])


def test_nothing_grows_or_goes_over_its_size_budget():
    over = _over_budget()
    new = {key: lines for key, lines in over.items() if key not in OVER_BUDGET}
    grown = {key: lines for key, lines in over.items() if lines > OVER_BUDGET.get(key, lines)}
    assert not new, f"over budget (module {MODULE_LINES}, class {CLASS_LINES}, function "
    f"{FUNCTION_LINES} lines): split them: {new}"
    assert not grown, f"grew past what OVER_BUDGET allows: {grown}"


def test_the_size_allow_list_only_shrinks():
    over = _over_budget()
    shrunk = {
        key: over.get(key, "within budget")
        for key, lines in OVER_BUDGET.items()
        if over.get(key, 0) < lines
    }
    assert not shrunk, f"smaller now: lower or delete these OVER_BUDGET entries: {shrunk}"


@pytest.mark.parametrize(
    "module",
    [
        "bundlefs",
        "bundlefs.read.bundle",
        "bundlefs.read.verify",
        "bundlefs.read.extract",
        "bundlefs.packing.packer",
        "bundlefs.cli",
        "bundlefs.mount.daemon",
        "bundlefs.mount.table",
    ],
)
def test_the_library_imports_without_pyfuse3_or_trio(module):
    code = _BLOCK_FUSE + f"import {module}\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_cli_and_the_mount_start_without_importlib_metadata():
    # ~40 ms of every command's and every mount's start (bundlefs/core/checksum.py and
    # third_party/pyfuse3/README.md say where).
    code = (
        "import sys, bundlefs.cli.app, bundlefs.mount.daemon, bundlefs.core.checksum as c\n"
        "from bundlefs.mount.bindings import pyfuse3  # the patched build: version-lazily.patch\n"
        "assert c.crc32c(b'123456789') == 0xE3069283\n"
        "print('importlib.metadata' in sys.modules, c._crc32c.__name__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "crc32c._crc32c"]


# What a mount of a local bundle never needs before it is ready: each is milliseconds of its
# start (docs/performance.md, "Mount start"); shutil is argparse's way to the terminal's width.
_NOT_AT_MOUNT_START = (
    "bundlefs.storage.objectstore",
    "bundlefs.packing",
    "bundlefs.read.diff",
    "bundlefs.cli.pack",
    "bundlefs.cli.verify",
    "bundlefs.cli.browse",
    "hashlib",
    "pathlib",
    "shutil",
    "subprocess",
    "socket",
)


def test_a_mount_of_a_local_bundle_starts_without_the_modules_it_does_not_use(
    sample_bundle_path,
):
    code = (
        "import os, sys, bundlefs.cli.app as app\n"
        "app.build_parser('mount').parse_args(['mount', sys.argv[1], '/mnt'])\n"
        "import bundlefs.mount.daemon, bundlefs.mount.operations, bundlefs.mount.worker\n"
        "from bundlefs.mount.bindings import pyfuse3\n"
        "from bundlefs import Bundle\n"
        "with Bundle(sys.argv[1]) as b:\n"
        "    b.read(next(p for p in b.paths() if b.isfile(p)))\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(sample_bundle_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "BUNDLEFS_NO_NATIVE": "1"},  # a checkout's stale check hashes
    )
    assert result.returncode == 0, result.stderr
    loaded = result.stdout.split()
    assert "bundlefs.read.bundle" in loaded and "pyfuse3" in loaded
    assert not [m for m in loaded if m.startswith(_NOT_AT_MOUNT_START)]


def test_the_format_layer_imports_no_storage_or_compression_library():
    for path in (PACKAGE / "core").rglob("*.py"):
        if path.name in ("checksum.py",):
            continue  # the CRC32C binding is what this module wraps
        names = {module.split(".")[0] for module, _ in _imports(path)}
        assert not names & {"lmdb", "lz4", "crc32c", "pyfuse3", "trio"}, path.name


def test_only_the_mount_package_imports_pyfuse3_or_trio():
    for path in _modules():
        if _package_of(path) == "mount":
            continue
        for module, _ in _imports(path):
            assert module.split(".")[0] not in ("pyfuse3", "trio"), f"{path} imports {module}"
            assert not module.startswith("bundlefs._fuse3"), f"{path} imports {module}"


def test_only_the_storage_layer_imports_lmdb():
    for path in _modules():
        if _package_of(path) == "storage":
            continue
        for module, _ in _imports(path):
            assert module.split(".")[0] != "lmdb", f"{path} imports lmdb"


def test_only_storage_and_integrations_import_fsspec_or_its_back_ends():
    # Object storage is the storage layer's business (and fsspec's own protocol, the
    # integration's): the read path above sees only a ShardStore.
    for path in _modules():
        if _package_of(path) in ("storage", "integrations"):
            continue
        for module, _ in _imports(path):
            top = module.split(".")[0]
            assert top not in ("fsspec", "s3fs", "botocore", "aiobotocore"), f"{path}: {module}"


def test_only_the_integrations_import_dask_or_distributed():
    # Distributed packing is an optional extra: the packer's partitions (packing/distributed/)
    # know nothing of Dask; integrations/dask.py runs them on a cluster.
    for path in _modules():
        if _package_of(path) == "integrations":
            continue
        for module, _ in _imports(path):
            assert module.split(".")[0] not in ("dask", "distributed"), f"{path}: {module}"


_BLOCK_DASK = """
import sys
class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("dask", "distributed"):
            raise ImportError(f"{name} is blocked in this test")
        return None
sys.meta_path.insert(0, _Blocker())
"""


@pytest.mark.parametrize(
    "module", ["bundlefs.packing.distributed.driver", "bundlefs.packing.merge", "bundlefs.cli"]
)
def test_the_packer_and_the_cli_import_without_dask(module):
    result = subprocess.run(
        [sys.executable, "-c", _BLOCK_DASK + f"import {module}\n"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_says_what_it_owns_and_what_it_may_import(path):
    docstring = ast.get_docstring(ast.parse(path.read_text()))
    assert docstring, f"{path}: a module docstring says what the module owns"
    if path.name != "__init__.py" or path.parent == PACKAGE:
        assert "May import:" in docstring, f"{path}: say what it may import"
