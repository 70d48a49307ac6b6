"""Reading a launch script as bash would, without running it: the variables it assigns (with `$VAR`,
`${VAR}`, `$((...))` expanded, and the environment for what it does not assign), the `if [ ... ]` branches it
takes, and the command that starts `pretrain_*.py` (directly, or through `eval "$cmd"`), split into the
launcher's words and the program's arguments.

Only what such scripts use is understood: assignments, `export`, simple test conditions, `eval`, and the script's
own arguments (`$1`, `${2:-default}`, `$@`, `$*`, `$#`, `shift`) as they are given. A condition that cannot be
read statically is taken as false and reported, never guessed silently.
"""
from __future__ import annotations

import ast
import bisect
import dataclasses
import operator
import os
import re
from typing import Sequence

from t5x_like.errors import UserError

NAME = r"[A-Za-z_][A-Za-z0-9_]*"
ASSIGNMENT = re.compile(rf"^({NAME})(\+?)=(.*)$", re.S)
ARRAY_START = re.compile(rf"^{NAME}\+?=$")
ARRAY = re.compile(rf"^({NAME})(\+?)=\($")
REDIRECTION = re.compile(r"^(\d*>>?(&\d)?|&>>?|\d*<)")
SKIPPED_COMMANDS = {"echo", "printf", "set", "mkdir", "cd", "source", ".", "cp", "rm", "ls", "hostname", "sleep",
                    "wait", "exit", "unset", "local", "declare", "trap", "cat", "tee", "touch"}


@dataclasses.dataclass
class Statement:
    words: list[str]  # raw words, quotes kept (expanded later)
    line: int


@dataclasses.dataclass
class Launch:
    """The command that starts the training program."""

    launcher: list[str]  # the words before the program (python, deepspeed ..., torchrun ...)
    program: str  # e.g. pretrain_gpt2.py
    arguments: list[str]  # its arguments, expanded
    line: int
    notes: list[str]  # what was read but not evaluated (conditions, positional arguments)


def statements(text: str) -> list[Statement]:
    """Split a script into statements (newline, `;`, `|`, `&`, `&&`, `||` outside quotes end one, but not inside
    an array's `NAME=( ... )`, and `&&` / `||` join the tests of an `if`; `\\`-newline joins lines, in double
    quotes too), each a list of raw words with their quotes; comments are dropped."""
    splitter = _Splitter(text)
    while splitter.i < len(text):
        splitter.step()
        splitter.i += 1
    if splitter.quote:
        raise UserError(f"line {splitter.current.line}: a {splitter.quote} quote is never closed; fix the script "
                        "(bash -n checks it).")
    splitter.end_statement()
    return splitter.out


class _Splitter:
    """statements()'s scan of a script, one character (or escape, or `$((...))`) per step."""

    def __init__(self, text: str):
        self.text, self.newlines = text, [k for k, c in enumerate(text) if c == "\n"]
        self.out: list[Statement] = []
        self.current = Statement([], 1)
        self.word, self.quote, self.i, self.array = "", "", 0, False

    def add(self, chars: str) -> None:
        if not self.word and not self.current.words:
            self.current.line = bisect.bisect_left(self.newlines, self.i) + 1
        self.word += chars

    def end_word(self) -> None:
        if self.word:
            self.current.words.append(self.word)
        self.word = ""

    def end_statement(self) -> None:
        self.end_word()
        if self.current.words:
            self.out.append(self.current)
        self.current = Statement([], 1)

    def step(self) -> None:
        text, i, quote = self.text, self.i, self.quote
        char, pair = text[i], text[i:i + 2]
        if pair == "\\\n" and quote != "'":
            self.i += 1
        elif quote:
            self.add(pair if char == "\\" and quote == '"' else char)
            self.i += 1 if char == "\\" and quote == '"' else 0
            self.quote = "" if char == quote else quote
        elif char == "\\":
            self.add(pair)
            self.i += 1
        elif char in "'\"":
            self.add(char)
            self.quote = char
        elif text.startswith("$((", i):
            end = text.index("))", i) + 2
            self.add(text[i:end])
            self.i = end - 1
        elif char == "#" and not self.word:
            self.i = text.find("\n", i) - 1 if "\n" in text[i:] else len(text)
        elif char == "(" and ARRAY_START.match(self.word) and set(self.current.words) <= {"then", "else", "export"}:
            self.add(char)
            self.end_word()
            self.array = True
        elif char == ")" and self.array:
            self.end_word()
            self.current.words.append(char)
            self.array = False
        elif char in " \t" or (self.array and char in "\n;"):
            self.end_word()
        elif pair in ("&&", "||") and self.current.words[:1] in (["if"], ["elif"]):
            self.end_word()
            self.current.words.append(pair)
            self.i += 1
        elif char in "\n;|" or (char == "&" and text[i - 1:i] != ">" and text[i + 1:i + 2] != ">"):
            self.end_statement()
            self.i += 1 if pair in ("&&", "||") else 0
        else:
            self.add(char)


class Shell:
    """The variables of a script as it runs top to bottom (the environment for those it does not set), run with
    `arguments` as its own ($1, $2, ...)."""

    def __init__(self, path: str, environ: dict[str, str] | None = None, arguments: Sequence[str] = ()):
        self.path = path
        self.arguments = list(arguments)
        self.variables: dict[str, str] = {}
        self.arrays: dict[str, list[str]] = {}
        self.environ = dict(os.environ if environ is None else environ)
        self.notes: list[str] = []
        self.line = 0

    def expand(self, raw: str, split: bool = True) -> list[str]:
        """A raw word's words after expansion: quoted parts stay whole, unquoted expansions split on spaces."""
        words, current, joined = [], "", False
        for part, quoted in _parts(raw):
            elements = self._quoted_array(part) if quoted == '"' and split else None
            if elements is not None:  # "${NAME[@]}": a word per element (none for an empty array)
                if len(elements) > 1:
                    words += [current + elements[0], *elements[1:-1]]
                    current = ""
                current, joined = (current + elements[-1], True) if elements else (current, joined)
                continue
            value = part if quoted == "'" else self._substitute(part)
            if quoted or not split:
                current, joined = current + value, True
                continue
            pieces = value.split()
            if value[:1].isspace() and (current or joined):
                words.append(current)
                current, joined = "", False
            for k, piece in enumerate(pieces):
                if k:
                    words.append(current)
                    current = ""
                current, joined = current + piece, True
            if value[-1:].isspace() and pieces:
                words.append(current)
                current, joined = "", False
        if current or joined:
            words.append(current)
        return words

    def value(self, raw: str) -> str:
        return "".join(self.expand(raw, split=False))

    def _substitute(self, text: str) -> str:
        def replace(match: re.Match) -> str:
            if match["arith"] is not None:
                return str(self._arithmetic(match["arith"]))
            if match["array"] is not None:
                return " ".join(self.arrays.get(match["array"], []))
            name = match["braced"] or match["plain"] or match["special"] or match["defaulted"]
            defaulted = match["defaulted"] is not None
            value = self.positional(name, quiet=defaulted) if not name.isidentifier() \
                else self.lookup(name, quiet=defaulted)
            unset = not value if match["op"] == ":-" else not self.is_set(name)
            if defaulted and unset and not name.isidentifier():
                self.not_given(name, ": its default applies")
            return self.value(match["default"]) if defaulted and unset else value

        pattern = (rf"\$\(\((?P<arith>.*?)\)\)|\$\{{(?P<array>{NAME})\[[@*]\]\}}"
                   rf"|\$\{{(?P<braced>{NAME}|\d+|[@*#])\}}"
                   rf"|\$\{{(?P<defaulted>{NAME}|\d+)(?P<op>:?-)(?P<default>[^}}]*)\}}|\$(?P<plain>{NAME})"
                   rf"|\$(?P<special>[@*#\d])")
        return re.sub(pattern, replace, text.replace('\\"', '"'))

    def is_set(self, name: str) -> bool:
        if name.isdigit():
            return 0 < int(name) <= len(self.arguments)
        return name in self.variables or name in self.arrays or name in self.environ

    def _quoted_array(self, part: str) -> list[str] | None:
        """The words of "${NAME[@]}" (an element each) and of "$@" (an argument each); None for other parts."""
        if part in ("$@", "${@}"):
            self.positional("@")
            return list(self.arguments)
        match = re.fullmatch(rf"\$\{{({NAME})\[@\]\}}", part)
        return None if match is None else self.arrays.get(match[1], [])

    def positional(self, name: str, quiet: bool = False) -> str:
        """The script's own arguments: $1, $2 ... (empty and noted when not given, unless `quiet`: a default
        follows), $@ and $* (all of them, space-separated), $# (how many), $0 (the script)."""
        if name == "0":
            return self.path
        if name == "#":
            return str(len(self.arguments))
        given = self.arguments if name in "@*" else self.arguments[int(name) - 1:int(name)]
        if not given and not quiet:
            self.not_given(name)
        return " ".join(given)

    def not_given(self, name: str, then: str = "") -> None:
        note = f"{self.path}:{self.line}: ${name} (the script's own arguments) taken as empty{then}"
        if note not in self.notes:
            self.notes.append(note)

    def shift(self, words: list[str]) -> None:
        """`shift [N]`: the first N arguments dropped (none when there are fewer, as bash leaves them)."""
        if words and not words[0].isdigit():
            raise UserError(f"{self.path}:{self.line}: `shift {words[0]}`: bash needs a number of arguments to "
                            "shift; fix the script.")
        count = int(words[0]) if words else 1
        if count <= len(self.arguments):
            self.arguments = self.arguments[count:]

    def lookup(self, name: str, quiet: bool = False) -> str:
        if name in self.variables:
            return self.variables[name]
        if name in self.arrays:
            return next(iter(self.arrays[name]), "")
        if name in self.environ or quiet:
            return self.environ.get(name, "")
        note = f"{self.path}:{self.line}: ${name} is not set by the script or the environment: empty, as in bash"
        if note not in self.notes:
            self.notes.append(note)
        return ""

    def _arithmetic(self, expression: str) -> int:
        text = re.sub(rf"\$?\{{?({NAME})\}}?", lambda m: self.lookup(m[1]) or "0", expression)
        try:
            return _evaluate(ast.parse(text.strip(), mode="eval").body)
        except (SyntaxError, ValueError, KeyError, ZeroDivisionError):
            raise UserError(f"{self.path}:{self.line}: $(({expression})) is not integer arithmetic this tool "
                            "evaluates; write the number into the script.") from None

    def condition(self, words: list[str]) -> bool:
        """Tests joined by `&&` and `||` (left to right, as bash groups them)."""
        result, joiner, test = False, None, []
        for word in [*words, "&&"]:
            if word not in ("&&", "||"):
                test.append(word)
                continue
            value = self.test(test)
            result = value if joiner is None else (result and value) if joiner == "&&" else (result or value)
            joiner, test = word, []
        return result

    def test(self, words: list[str]) -> bool:
        """`[ A = B ]`-style tests; a test bash itself would fail on (`["$X" = y]`) is false, as there."""
        expanded = [w for raw in words for w in self.expand(raw)]
        if expanded and expanded[0] in ("[", "[[") and expanded[-1] in ("]", "]]"):
            inner = expanded[1:-1]
            if len(inner) == 3 and inner[1] in ("=", "==", "!="):
                return (inner[0] == inner[2]) == (inner[1] != "!=")
            if len(inner) == 2 and inner[0] in ("-n", "-z"):
                return bool(inner[1]) == (inner[0] == "-n")
            if len(inner) == 1:
                return bool(inner[0])
            if len(inner) == 0:
                return False
        if words and words[0].startswith("[") and words[0] not in ("[", "[["):
            self.notes.append(f"{self.path}:{self.line}: `{' '.join(words)}` is not a valid test (bash fails on it "
                              "too: `[` needs spaces around it), so its branch is not taken")
            return False
        self.notes.append(f"{self.path}:{self.line}: the condition `{' '.join(words)}` is not evaluated here; "
                          "its branch is taken as not run (check its flags by hand)")
        return False


def _parts(raw: str) -> list[tuple[str, str]]:
    """A raw word as (text, quote) parts: quote is '', "'" or '"'."""
    parts, i = [], 0
    while i < len(raw):
        if raw[i] in "'\"":
            end = raw.index(raw[i], i + 1) if raw[i] == "'" else _closing_double(raw, i)
            parts.append((raw[i + 1:end], raw[i]))
            i = end + 1
        else:
            j = i
            while j < len(raw) and raw[j] not in "'\"":
                j = _closing_brace(raw, j) + 1 if raw.startswith("${", j) else j + (2 if raw[j] == "\\" else 1)
            parts.append((raw[i:j].replace("\\", ""), ""))
            i = j
    return parts


def _closing_brace(raw: str, start: int) -> int:
    """The `}` that closes the `${` at `start` (quotes inside, as in `${1:-"default"}`, skipped)."""
    quote = ""
    for k in range(start + 2, len(raw)):
        if quote:
            quote = "" if raw[k] == quote else quote
        elif raw[k] in "'\"":
            quote = raw[k]
        elif raw[k] == "}":
            return k
    return len(raw) - 1


def _closing_double(raw: str, start: int) -> int:
    i = start + 1
    while raw[i] != '"':
        i += 2 if raw[i] == "\\" else 1
    return i


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
              ast.Div: operator.floordiv, ast.Mod: operator.mod}


def _evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    raise ValueError(node)


def find_launch(path: str, text: str, environ: dict[str, str] | None = None,
                arguments: Sequence[str] = ()) -> Launch | None:
    """Run the script's assignments and conditions in order, with `arguments` as its own, and return the command
    that starts a `*.py` program (the last one, if several), or None when the script starts none."""
    shell = Shell(path, environ, arguments)
    taking: list[bool] = []  # per open `if`: whether its current branch runs
    decided: list[bool] = []  # per open `if`: whether a branch was taken already
    found = None
    for statement in statements(text):
        shell.line = statement.line
        words, head = statement.words, statement.words[0]
        if head in ("if", "elif"):
            words = [w for w in words[1:] if w != "then"]
            if head == "if":
                taking.append(False), decided.append(False)
            runs = all(taking[:-1]) and not decided[-1] and shell.condition(words)
            taking[-1], decided[-1] = runs, decided[-1] or runs
            continue
        if head == "else":
            taking[-1] = not decided[-1]
        if head == "fi":
            taking.pop(), decided.pop()
            continue
        words = words[1:] if head in ("then", "else") else words  # `then command` on the `if`'s line
        if words and all(taking):
            found = _run(shell, words, statement.line) or found
    if found is not None:
        found.notes = shell.notes
    return found


def _run(shell: Shell, words: list[str], line: int) -> Launch | None:
    """One statement: an assignment updates the variables; a command starting a .py program is the launch."""
    if words[0] == "export":
        words = words[1:]
    if words and ARRAY.match(words[0]) and words[-1] == ")":  # NAME=( ... ) or NAME+=( ... )
        name, append = ARRAY.match(words[0]).groups()
        elements = [w for raw in words[1:-1] for w in shell.expand(raw)]
        shell.arrays[name] = (shell.arrays.get(name, []) if append else []) + elements
        return None
    if words and ASSIGNMENT.match(words[0]) and len(words) == 1:
        name, append, raw = ASSIGNMENT.match(words[0]).groups()
        shell.variables[name] = (shell.lookup(name, quiet=True) if append else "") + shell.value(raw)
        return None
    if words and ASSIGNMENT.match(words[0]) and ASSIGNMENT.match(words[0])[3].startswith("<"):
        name = ASSIGNMENT.match(words[0])[1]
        shell.notes.append(f"{shell.path}:{line}: {name} is a placeholder ({' '.join(words)[len(name) + 1:]}) the "
                           "script's user fills in: read as empty")
        shell.variables[name] = ""
        return None
    while words and ASSIGNMENT.match(words[0]):  # VAR=value command ...: an environment for the command
        words = words[1:]
    words = without_redirections(words)
    expanded = [w for raw in words for w in shell.expand(raw)]
    if expanded[:1] == ["shift"]:
        shell.shift(expanded[1:])
        return None
    if not expanded or expanded[0] in SKIPPED_COMMANDS:
        return None
    if expanded[0] == "eval":
        inner = statements(" ".join(expanded[1:]))
        return _run(shell, inner[0].words, line) if inner else None
    programs = [i for i, w in enumerate(expanded) if w.endswith(".py")]
    if not programs:
        return None
    first = programs[0]
    return Launch(expanded[:first], os.path.basename(expanded[first]), expanded[first + 1:], line, [])


def without_redirections(words: list[str]) -> list[str]:
    """A command's words less its redirections (`> log`, `2>&1`, `&> out`, `< in`)."""
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif REDIRECTION.match(word):
            skip = REDIRECTION.match(word)[0] == word and not word.endswith(("&1", "&2"))  # `>` alone: a target next
        else:
            kept.append(word)
    return kept


def launcher_gpus(launcher: list[str]) -> int | None:
    """How many processes a launcher starts (python: 1; torchrun / torch.distributed.launch: nproc_per_node x
    nnodes; deepspeed: --num_gpus x --num_nodes or the GPUs of `-i host:0,1,...`); None when it does not say."""
    options = _options(launcher)
    if not launcher or os.path.basename(launcher[0]).startswith("python") and "-m" not in launcher:
        return 1
    if "nproc_per_node" in options:
        return int(options["nproc_per_node"]) * int(options.get("nnodes", "1").split(":")[-1])
    if "num_gpus" in options:
        return int(options["num_gpus"]) * int(options.get("num_nodes", "1"))
    include = options.get("i") or options.get("include")
    if include:
        return sum(len(part.split(":")[1].split(",")) if ":" in part else 1 for part in include.split("@"))
    return None


def _options(words: list[str]) -> dict[str, str]:
    options = {}
    for k, word in enumerate(words):
        if word.startswith("-"):
            name, _, value = word.lstrip("-").partition("=")
            options[name.replace("-", "_")] = value or (words[k + 1] if k + 1 < len(words) else "")
    return options
