"""A launch script's variables as bash expands them, without running anything: `$VAR`, `${VAR}`, `${VAR:-default}`,
`$((...))`, arrays (`"${A[@]}"`, `${A[1]}`, `${#A[@]}`), the script's own arguments (`$1`, `"$@"`, `$#`, `shift`)
and `[ ... ]` tests. What is not evaluated (`$(...)` and backticks, other `${...}` forms) is empty and noted with
its line, and where a value came from can be told (`origin`) when it is not what a setting needs.
"""
from __future__ import annotations

import ast
import operator
import os
import re
from typing import Sequence

from t5x_like.errors import UserError

NAME = r"[A-Za-z_][A-Za-z0-9_]*"
EXPANSION = re.compile(
    rf"\$\(\((?P<arith>.*?)\)\)|\$\{{(?P<array>{NAME})\[[@*]\]\}}|\$\{{#(?P<count>{NAME})\[[@*]\]\}}"
    rf"|\$\{{(?P<indexed>{NAME})\[(?P<index>\d+)\]\}}|\$\{{#(?P<length>{NAME})\}}"
    rf"|\$\{{(?P<braced>{NAME}|\d+|[@*#])\}}"
    rf"|\$\{{(?P<defaulted>{NAME}|\d+)(?P<op>:?-)(?P<default>[^}}]*)\}}|\$\{{(?P<other>[^}}]*)\}}"
    rf"|\$(?P<plain>{NAME})|\$(?P<special>[@*#\d])")
REFERENCE = re.compile(rf"\$\{{?#?({NAME}|\d)")


class Shell:
    """The variables of a script as it runs top to bottom (the environment for those it does not set), run with
    `arguments` as its own ($1, $2, ...)."""

    def __init__(self, path: str, environ: dict[str, str] | None = None, arguments: Sequence[str] = ()):
        self.path = path
        self.arguments = list(arguments)
        self.variables: dict[str, str] = {}
        self.arrays: dict[str, list[str]] = {}
        self.assigned: dict[str, tuple[int, str]] = {}  # name -> (line, raw value) of its last assignment
        self.environ = dict(os.environ if environ is None else environ)
        self.notes: list[str] = []
        self.line = 0

    def note(self, text: str) -> None:
        """A note on what was read but not evaluated, at the current line (once)."""
        note = f"{self.path}:{self.line}: {text}"
        if note not in self.notes:
            self.notes.append(note)

    def assign(self, name: str, raw: str, append: bool = False) -> None:
        self.variables[name] = (self.lookup(name, quiet=True) if append else "") + self.value(raw)
        self.assigned[name] = (self.line, f"{name}{'+' if append else ''}={raw}")

    def expand(self, raw: str, split: bool = True) -> list[str]:
        """A raw word's words after expansion: quoted parts stay whole, unquoted expansions split on spaces."""
        words, current, joined = [], "", False
        for part, quoted in parts(raw):
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
        return EXPANSION.sub(self._replace, self._without_commands(text.replace('\\"', '"')))

    def _replace(self, match: re.Match) -> str:
        if match["arith"] is not None:
            return str(self._arithmetic(match["arith"]))
        if match["array"] is not None:
            return " ".join(self.arrays.get(match["array"], []))
        if match["count"] is not None:
            return str(len(self.arrays.get(match["count"], [])))
        if match["indexed"] is not None:
            name = match["indexed"]
            elements = self.arrays[name] if name in self.arrays else [self.lookup(name)]
            return elements[int(match["index"])] if int(match["index"]) < len(elements) else ""
        if match["length"] is not None:
            return str(len(self.lookup(match["length"])))
        if match["other"] is not None:
            self.note(f"`${{{match['other']}}}` is not evaluated here: taken as empty")
            return ""
        name = match["braced"] or match["plain"] or match["special"] or match["defaulted"]
        defaulted = match["defaulted"] is not None
        value = self.positional(name, quiet=defaulted) if not name.isidentifier() \
            else self.lookup(name, quiet=defaulted)
        unset = not value if match["op"] == ":-" else not self.is_set(name)
        if defaulted and unset and not name.isidentifier():
            self.not_given(name, ": its default applies")
        return self.value(match["default"]) if defaulted and unset else value

    def _without_commands(self, text: str) -> str:
        """`text` less its command substitutions (`$(...)`, backticks), each noted: they are not run here."""
        out, i = [], 0
        while i < len(text):
            if text.startswith("$(", i) and not text.startswith("$((", i):
                end = closing_paren(text, i + 1)
            elif text[i] == "`" and "`" in text[i + 1:]:
                end = text.index("`", i + 1)
            else:
                out.append(text[i])
                i += 1
                continue
            shown = text[i:end + 1] if text[i] == "`" else f"`{text[i:end + 1]}`"
            self.note(f"the command {shown} is not run here: taken as empty (write its value into the script)")
            i = end + 1
        return "".join(out)

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
        self.note(f"${name} (the script's own arguments) taken as empty{then}")

    def shift(self, words: list[str]) -> None:
        """`shift [N]`: the first N arguments dropped; with fewer, bash fails and leaves them (noted)."""
        if words and not words[0].isdigit():
            raise UserError(f"{self.path}:{self.line}: `shift {words[0]}`: bash needs a number of arguments to "
                            "shift; fix the script.")
        count = int(words[0]) if words else 1
        if count <= len(self.arguments):
            self.arguments = self.arguments[count:]
            return
        self.note(f"`shift {count}` fails: {len(self.arguments)} of the script's own arguments are left, and bash "
                  "leaves them as they are (give the arguments the script expects after `--`)")

    def lookup(self, name: str, quiet: bool = False) -> str:
        if name in self.variables:
            return self.variables[name]
        if name in self.arrays:
            return next(iter(self.arrays[name]), "")
        if name in self.environ or quiet:
            return self.environ.get(name, "")
        self.note(f"${name} is not set by the script or the environment: empty, as in bash")
        return ""

    def origin(self, name: str) -> str:
        """Where `$name`'s value comes from and how to give another: for an error about a value it supplies."""
        if name.isdigit():
            return (f"${name} is the script's own argument {name}: give the script's arguments after `--` "
                    f"(python -m t5x_like.migrate {self.path} -- ARG1 ARG2 ...)")
        if name in self.assigned:
            line, written = self.assigned[name]
            unset = [f"${n}" for n in REFERENCE.findall(written.partition("=")[2])
                     if not n.isdigit() and not self.is_set(n)]
            inner = f", where {', '.join(unset)} {'is' if len(unset) == 1 else 'are'} not set" if unset else ""
            return f"${name} is set at {self.path}:{line} (`{written}`{inner}): write the value into that line"
        if name in self.environ:
            return (f"${name} comes from the environment ({name}={self.environ[name]!r}): set it there to the value "
                    "the run used")
        return (f"${name} is not set by the script or the environment: set it in the environment ({name}=VALUE "
                "python -m t5x_like.migrate ...) or in the script")

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
            self.note(f"`{' '.join(words)}` is not a valid test (bash fails on it too: `[` needs spaces around it), "
                      "so its branch is not taken")
            return False
        self.note(f"the condition `{' '.join(words)}` is not evaluated here; its branch is taken as not run (check "
                  "its flags by hand)")
        return False


def parts(raw: str) -> list[tuple[str, str]]:
    """A raw word as (text, quote) parts: quote is '', "'" or '"'."""
    out, i = [], 0
    while i < len(raw):
        if raw[i] in "'\"":
            end = raw.index(raw[i], i + 1) if raw[i] == "'" else _closing_double(raw, i)
            out.append((raw[i + 1:end], raw[i]))
            i = end + 1
        else:
            j = i
            while j < len(raw) and raw[j] not in "'\"":
                j = _closing_brace(raw, j) + 1 if raw.startswith("${", j) else \
                    closing_paren(raw, j + 1) + 1 if raw.startswith("$(", j) else j + (2 if raw[j] == "\\" else 1)
            out.append((raw[i:j].replace("\\", ""), ""))
            i = j
    return out


def closing_paren(text: str, start: int) -> int:
    """The `)` that closes the `(` at `start` (nested parentheses and quoted text skipped); the end if none."""
    depth, quote = 0, ""
    for k in range(start, len(text)):
        if quote:
            quote = "" if text[k] == quote else quote
        elif text[k] in "'\"":
            quote = text[k]
        elif text[k] == "(":
            depth += 1
        elif text[k] == ")":
            depth -= 1
            if depth == 0:
                return k
    return len(text) - 1


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
