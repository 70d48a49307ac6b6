"""The shape of the code (issue 42's measures, kept): rooms rather than one flat package, no file or function past
its size, no import circle, rooms that import only downward (issue 53), family names only in the family's own files,
gin read only by its front-end."""
import ast
import io
import pathlib
import re
import tokenize

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("t5x_like", "models", "partitioning", "configs")
MAX_FILE_LINES, MAX_FUNCTION_LINES, MAX_TOP_MODULES = 400, 50, 15
NEAR_SYNONYMS = (("train", "trainer", "training"), ("validate", "validation"), ("eval", "evaluation"),
                 ("checkpoint", "checkpoints"))
GIN_CALLS = ("get_bindings", "query_parameter", "bind_parameter", "config_str", "parse_config", "unlock_config",
             "operative_config_str", "parse_config_files_and_bindings")


def sources() -> list[pathlib.Path]:
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_runtime_is_in_rooms_with_one_name_per_idea():
    top = sorted(p.stem for p in (REPO / "t5x_like").glob("*.py") if p.stem != "__init__")
    assert len(top) <= MAX_TOP_MODULES, top
    rooms = {p.stem for p in (REPO / "t5x_like").iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    for names in NEAR_SYNONYMS:
        assert len(rooms & set(names)) <= 1, f"rooms named alike: {sorted(rooms & set(names))}"
    assert not any(name.startswith("checkpoint_") for name in rooms), sorted(rooms)


def test_the_tests_mirror_the_rooms():
    """tests/t5x_like/<room>/ for each room (package) of t5x_like, nested rooms too, and no test folder for
    anything else; the tests of a top-level module (t5x_like/<module>.py) sit flat in tests/t5x_like/."""
    def folders(root: pathlib.Path) -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir() and p.name != "__pycache__"
                and any(p.glob("*.py"))}

    rooms = {room for room in folders(REPO / "t5x_like") if (REPO / "t5x_like" / room / "__init__.py").exists()}
    assert folders(REPO / "tests" / "t5x_like") == rooms


def test_test_files_are_named_for_what_they_test():
    """Not for the issue that asked for them."""
    named_for_issues = [p.name for p in (REPO / "tests").rglob("test_*.py")
                        if re.search(r"issue|reliability|bad_input|regression", p.stem)]
    assert not named_for_issues


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_file_or_function_is_too_long(path):
    text = path.read_text()
    assert text.count("\n") <= MAX_FILE_LINES, f"{path.relative_to(REPO)}: {text.count(chr(10))} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            assert length <= MAX_FUNCTION_LINES, f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {length} lines"


def module_level_imports(path: pathlib.Path) -> set[str]:
    """The modules of ours `path` imports when it is imported (not inside functions)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name.split(".")[0] in PACKAGES}


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in sources()}
    return {name: {m for m in module_level_imports(path) if m in modules and m != name and not name.startswith(m + ".")}
            for name, path in modules.items()}


def cycle_from(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle among the modules (a package's __init__ reached from inside it does not count), or None."""
    state: dict[str, int] = {}

    def visit(node, trail):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return trail[trail.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, trail + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_import_circle():
    assert cycle_from(import_graph()) is None


def test_an_import_circle_is_found():
    assert cycle_from({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


ROOMS = ("errors", "features", "metrics", "checks", "cluster", "data", "optim", "checkpoint", "migration", "lm",
         "inference", "convert", "step_fns", "experiment", "eval", "run", "config")
"""t5x_like's rooms, lowest first (docs/design.md, "The rooms"): a module imports its own room and rooms below it."""
ENTRY_POINTS = ("train", "compile", "generate", "migrate", "plot", "t5x_like")
"""Above every room, side by side (none imports another): the commands and the package's Python API
(t5x_like/__init__.py: load_model). A command inside a room (eval/cli.py, data/preprocess.py, ...) keeps its place."""
ROOM_RULE = ("a room imports only itself and the rooms below it (ROOMS, lowest first, in tests/test_code_shape.py; "
             "docs/design.md, The rooms): move what both need down")
OURS_OUTSIDE_THE_RUNTIME = {"models": ("models",), "partitioning": ("partitioning",),
                            "configs": ("configs", "models", "partitioning")}
"""What models/, partitioning/ and configs/ may import of ours (t5x_like sits above them all)."""


def room_of(module: str) -> str:
    """The room of a t5x_like module (its top-level module or subpackage; "t5x_like" for the package itself),
    else the package of ours the module is in."""
    parts = module.split(".")
    return parts[1] if parts[0] == "t5x_like" and len(parts) > 1 else parts[0]


def level(room: str) -> int:
    return ROOMS.index(room) if room in ROOMS else len(ROOMS)


def imports_of(text: str, modules: set[str]) -> list[tuple[int, str]]:
    """(line, module) for each import of ours in `text`, inside functions too (a lazy import is a dependency all
    the same); `from P import x` names the module P.x where there is one, else P; a relative import is "."."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            found.append((node.lineno, "."))
        elif isinstance(node, ast.ImportFrom):
            named = (f"{node.module}.{alias.name}" for alias in node.names)
            found += [(node.lineno, name if name in modules else node.module) for name in named]
    return [(line, name) for line, name in found if name == "." or name.split(".")[0] in PACKAGES]


def import_rule_breaks(module: str, path: str, imports: list[tuple[int, str]]) -> list[str]:
    """One line for each of the `imports` (imports_of) of `module` (file `path`) that runs against the rooms' order."""
    breaks, package, room = [], module.split(".")[0], room_of(module)
    for line, name in imports:
        if name == ".":
            breaks.append(f"{path}:{line}: a relative import; import absolutely, so that its room is plain")
        elif package != "t5x_like" and name.split(".")[0] not in OURS_OUTSIDE_THE_RUNTIME[package]:
            allowed = ", ".join(OURS_OUTSIDE_THE_RUNTIME[package])
            breaks.append(f"{path}:{line} imports {name}: {package}/ imports nothing of ours but {allowed}")
        elif (package == name.split(".")[0] == "t5x_like" and room_of(name) != room
              and level(room_of(name)) >= level(room)):
            breaks.append(f"{path}:{line} imports {name}, of room {room_of(name)}, not below room {room}: {ROOM_RULE}")
    return breaks


def test_rooms_import_only_downward():
    paths = {module_name(p): p for p in sources()}
    rooms = {room_of(m) for m in paths if m.startswith("t5x_like")}
    placed = set(ROOMS) | set(ENTRY_POINTS)
    assert rooms <= placed, f"give these rooms their place in ROOMS: {sorted(rooms - placed)}"
    imports = {m: imports_of(p.read_text(), set(paths)) for m, p in paths.items()}
    breaks = [line for m, p in paths.items() for line in import_rule_breaks(m, str(p.relative_to(REPO)), imports[m])]
    assert not breaks, "\n".join(breaks)


def test_an_import_against_the_order_is_named_with_its_line_room_and_rule():
    def breaks(module: str, text: str) -> list[str]:
        path = module.replace(".", "/") + ".py"
        return import_rule_breaks(module, path, imports_of(text, {"t5x_like.errors", "t5x_like.run.lock"}))

    lazy_upward = "from t5x_like import errors\n\n\ndef f():\n    from t5x_like.run import lock\n"
    assert breaks("t5x_like.data.token_file", lazy_upward) == [
        f"t5x_like/data/token_file.py:5 imports t5x_like.run.lock, of room run, not below room data: {ROOM_RULE}"]
    assert breaks("t5x_like.generate", "import t5x_like.train\n") == [
        f"t5x_like/generate.py:1 imports t5x_like.train, of room train, not below room generate: {ROOM_RULE}"]
    assert breaks("models.gpt2", "from t5x_like import errors\n") == [
        "models/gpt2.py:1 imports t5x_like.errors: models/ imports nothing of ours but models"]
    assert breaks("t5x_like.lm.base", "from . import beam_search\n") == [
        "t5x_like/lm/base.py:1: a relative import; import absolutely, so that its room is plain"]


def code_tokens(path: pathlib.Path) -> list[tokenize.TokenInfo]:
    """The names and strings of a file's code: no comments, no docstrings (or other lone string statements)."""
    text = path.read_text()
    lone_strings = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            lone_strings.update(range(node.lineno, node.end_lineno + 1))
    return [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type in (tokenize.NAME, tokenize.STRING) and t.start[0] not in lone_strings]


def family_files(family: str) -> set[pathlib.Path]:
    return {REPO / "models" / f"{family}.py", REPO / "configs" / f"{family}.py",
            REPO / "t5x_like" / "convert" / f"{family}.py"}


@pytest.mark.parametrize("family", ["llama"])
def test_only_a_familys_own_files_and_one_registry_name_it(family):
    import models

    others = {f for f in models.FAMILIES if f != family}
    naming = sorted(str(p.relative_to(REPO)) for p in sources()
                    if p not in family_files(family) and not any(p in family_files(other) for other in others)
                    and any(re.search(rf"\b{family}\b", t.string, re.I) for t in code_tokens(p)))
    assert len(naming) <= 1, naming


def test_gin_is_read_in_config_only():
    """One configuration channel: only t5x_like/config/ imports gin (and calls it); the rest takes typed settings."""
    outside = [f"{p.relative_to(REPO)}:{node.lineno} imports gin" for p in sources()
               if not p.is_relative_to(REPO / "t5x_like" / "config") for node in ast.walk(ast.parse(p.read_text()))
               if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "gin" for a in node.names)
               or isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gin"]
    outside += [f"{p.relative_to(REPO)}:{t.start[0]} calls {t.string}" for p in sources()
                if not p.is_relative_to(REPO / "t5x_like" / "config")
                for t in code_tokens(p) if t.type == tokenize.NAME and t.string in GIN_CALLS]
    assert not outside, outside
