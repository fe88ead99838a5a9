"""Dependencies point one way: no module of ``src/pgstreams`` (or ``src/pgstreams_ml``) imports a module of
a layer above its own, at module level, inside a function or under ``if TYPE_CHECKING:`` alike.

The layers, bottom to top (docs/architecture.md draws them):

0. ``base``: the leaf modules (errors, models, names, codec, partitioner, topicconfig, reconnect, services,
   embedded, migrate, dltheaders and any module not named below) and ``storage``;
1. ``session``: the session and the ports (the protocols the layers above see it through);
2. ``middle``: producer, consumer, groups, shares, maintenance, admin (the client's administration) and cdc;
3. ``client``: the public facade;
4. ``runtime``: worker and cluster;
5. ``connecting``: connecting, aio and the package's public names (``pgstreams/__init__.py``);
6. ``extras``: metrics, console, spark, kafka, cli;
7. ``application``: pgstreams_ml.

Imports within a layer are allowed between the packages :data:`SAME_LAYER` names, and only those (the
base layer's leaves import each other freely): a new one is a decision to write down here.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("base", frozenset({"errors", "models", "names", "codec", "partitioner", "topicconfig", "reconnect",
                        "services", "embedded", "migrate", "dltheaders", "storage"})),
    ("session", frozenset({"session", "ports"})),
    ("middle", frozenset({"producer", "consumer", "groups", "shares", "maintenance", "admin", "cdc"})),
    ("client", frozenset({"client"})),
    ("runtime", frozenset({"worker", "cluster"})),
    ("connecting", frozenset({"connecting", "aio", ""})),  # "": the package pgstreams itself
    ("extras", frozenset({"metrics", "console", "spark", "spark_daemon", "kafka", "cli"})),
)
APPLICATION = "application"  # pgstreams_ml, above everything
RANK = {name: i for i, (name, _) in enumerate(LAYERS)} | {APPLICATION: len(LAYERS)}

#: The imports between different parts of one layer (importer, imported), each one that exists.
SAME_LAYER = frozenset({
    ("session", "ports"),  # the session's topic cache holds what the ports call a topic view
    ("shares", "consumer"),  # start positions, rows to events, the wake-up rule
    ("admin", "consumer"),  # resetting a group and replaying dead letters read as a stream group
    ("admin", "shares"),  # share consumers and queues
    ("cdc", "producer"),  # a capture stores its events with the producer's COPY, in its own transaction
    ("cluster", "worker"),  # ClusterWorker runs one Worker per shard
    ("aio", "connecting"),  # the asyncio client resolves its DSN as connect() does
    ("cli", "metrics"),  # the worker command's metrics endpoint
    ("cli", "console"),  # the console command
    ("cli", "kafka"),  # the kafka serve command
})

def part_of(module: str) -> str:
    """The part of the code ``module`` belongs to: ``consumer`` for ``pgstreams.consumer.reader``, ``""``
    for the package ``pgstreams`` itself, ``pgstreams_ml`` for the application."""
    top, _, rest = module.partition(".")
    return top if top != "pgstreams" else rest.split(".")[0]


def layer_of(module: str) -> str:
    """The layer of ``module`` (an unnamed module of ``pgstreams`` is a leaf: base)."""
    part = part_of(module)
    if part == "pgstreams_ml":
        return APPLICATION
    return next((name for name, parts in LAYERS if part in parts), "base")


@dataclass(frozen=True)
class Import:
    """``importer`` imports ``imported`` at ``line``, counted in layer ``layer``."""

    importer: str
    imported: str
    line: int
    layer: str


def _is_module(name: str) -> bool:
    path = SRC.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(module: str, source: str, *, is_package: bool = False) -> Iterator[Import]:
    """Every import of ``pgstreams`` or ``pgstreams_ml`` modules in ``source`` (module ``module``), wherever
    it is: at module level, in a function, under ``if TYPE_CHECKING:``. ``from X import name`` imports
    ``X.name`` when that is a module, else ``X``."""
    own = layer_of(module)

    def visit(node: ast.AST) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(module, alias.name, child.lineno, own)
            elif isinstance(child, ast.ImportFrom):
                target = _resolve(module, is_package, child)
                for alias in child.names:
                    sub = f"{target}.{alias.name}"
                    yield Import(module, sub if _is_module(sub) else target, child.lineno, own)
            yield from visit(child)

    for found in visit(ast.parse(source)):
        if found.imported.split(".")[0] in ("pgstreams", "pgstreams_ml"):
            yield found


def all_imports() -> list[Import]:
    """The imports of every module under ``src/pgstreams`` and ``src/pgstreams_ml``."""
    out: list[Import] = []
    for root in ("pgstreams", "pgstreams_ml"):
        for path in sorted((SRC / root).rglob("*.py")):
            parts = list(path.relative_to(SRC).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            module = ".".join(parts[:-1] if is_package else parts)
            out += imports_of(module, path.read_text(encoding="utf-8"), is_package=is_package)
    return out


def upward(imports: list[Import]) -> list[str]:
    """The imports of a module of a higher layer than the importer's, described."""
    return [f"{i.importer} ({i.layer}) imports {i.imported} ({layer_of(i.imported)}) at line {i.line}"
            for i in imports if RANK[layer_of(i.imported)] > RANK[i.layer]]


def same_layer(imports: list[Import]) -> set[tuple[str, str]]:
    """The (importer, imported) parts of the imports within one layer above the base, between parts."""
    return {(part_of(i.importer), part_of(i.imported)) for i in imports
            if i.layer != "base" and layer_of(i.imported) == i.layer
            and part_of(i.importer) != part_of(i.imported) and part_of(i.importer) != ""}


def test_no_module_imports_a_higher_layer() -> None:
    bad = upward(all_imports())
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_the_imports_within_a_layer_are_those_named() -> None:
    found = same_layer(all_imports())
    assert not found - SAME_LAYER, f"imports within a layer not named in SAME_LAYER: {found - SAME_LAYER}"
    assert not SAME_LAYER - found, f"SAME_LAYER names imports that no longer exist: {SAME_LAYER - found}"


def test_an_import_under_type_checking_or_in_a_function_counts() -> None:
    source = ("from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
              "from ..errors import InvalidArgument\n"
              "if TYPE_CHECKING:\n    from ..client import Client\n"
              "def run() -> None:\n    from ..worker import run_consumer\n")
    bad = upward(list(imports_of("pgstreams.consumer.reader", source)))
    assert bad == ["pgstreams.consumer.reader (middle) imports pgstreams.client (client) at line 5",
                   "pgstreams.consumer.reader (middle) imports pgstreams.worker (runtime) at line 7"]
