"""Reading a launch script as bash would, without running it: the statements (this file), the variables they
assign and expand (variables.py), the `if [ ... ]` branches taken, and the command that starts `pretrain_*.py`
(directly, or through `eval "$cmd"`), split into the launcher's words and the program's arguments.

Only what such scripts use is evaluated: assignments, `export`, arrays, simple test conditions, `eval`, and the
script's own arguments (`$1`, `${2:-default}`, `$@`, `$*`, `$#`, `shift`) as they are given. What is read but not
evaluated (loops, `case`, functions, `$(...)`, a condition that cannot be read statically, a failing `shift`) is
noted with its line, never guessed silently.
"""
from __future__ import annotations

import bisect
import dataclasses
import os
import re
from typing import Callable, Sequence

from t5x_like.errors import UserError
from t5x_like.migration.variables import NAME, REFERENCE, Shell, closing_paren

ASSIGNMENT = re.compile(rf"^({NAME})(\+?)=(.*)$", re.S)
ARRAY_START = re.compile(rf"^{NAME}\+?=$")
ARRAY = re.compile(rf"^({NAME})(\+?)=\($")
FUNCTION = re.compile(rf"^({NAME})\(\)$")
REDIRECTION = re.compile(r"^(\d*>>?(&\d)?|&>>?|\d*<)")
SKIPPED_COMMANDS = {"echo", "printf", "set", "mkdir", "cd", "source", ".", "cp", "rm", "ls", "hostname", "sleep",
                    "wait", "exit", "unset", "local", "declare", "trap", "cat", "tee", "touch"}
LOOPS = ("while", "until", "for", "select")
CLOSERS = {"done": "loop", "esac": "case", "}": "function", "fi": "if"}
OWN_ARGUMENTS = re.compile(r"\$\{?[1-9#@*]")


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
    shell: Shell | None = None  # the variables as the script left them

    def origin(self, text: str, flag: str) -> str | None:
        """Where the value of `flag` (as `text` writes it) comes from, when a variable gives it."""
        match = re.search(rf"(?<![\w-]){re.escape(flag)}(?:=|[ \t]+)(\S*)", text)
        reference = REFERENCE.search(match[1]) if match else None
        return self.shell.origin(reference[1]) if reference and self.shell else None


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
    """statements()'s scan of a script, one character (or escape, `$((...))`, `$(...)`) per step."""

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
        elif text.startswith("$(", i) or (char == "`" and "`" in text[i + 1:]):  # a command substitution: one piece
            end = closing_paren(text, i + 1) if char == "$" else text.index("`", i + 1)
            self.add(text[i:end + 1])
            self.i = end
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


@dataclasses.dataclass
class _Block:
    kind: str  # 'if', 'loop', 'case' or 'function'
    taking: bool = False  # an `if`: whether its current branch runs (the others never run here)
    decided: bool = False  # an `if`: whether a branch was taken already


class _Walk:
    """find_launch()'s pass over the statements: the blocks open at each (`if` branches taken or not; loops, `case`
    and function bodies not run, each noted), and the launch found."""

    def __init__(self, shell: Shell):
        self.shell, self.blocks, self.functions = shell, [], set()
        self.found: Launch | None = None

    def runs(self) -> bool:
        return all(block.taking for block in self.blocks)

    def statement(self, words: list[str]) -> None:
        head = words[0]
        if head in ("if", "elif"):
            self.branch(head, [w for w in words[1:] if w != "then"])
        elif head in CLOSERS:
            kinds = [block.kind for block in self.blocks]
            if CLOSERS[head] in kinds:
                del self.blocks[len(kinds) - 1 - kinds[::-1].index(CLOSERS[head])]
        elif head in LOOPS or head == "case" or FUNCTION.match(head) or head == "function":
            self.open(head, words)
        else:
            if head == "else" and self.blocks:
                self.blocks[-1].taking = not self.blocks[-1].decided
            words = words[1:] if head in ("then", "else") else words  # `then command` on the `if`'s line
            if words and self.runs():
                self.command(words)

    def branch(self, head: str, condition: list[str]) -> None:
        if head == "if":
            self.blocks.append(_Block("if"))
        block = self.blocks[-1]
        block.taking = all(b.taking for b in self.blocks[:-1]) and not block.decided and \
            self.shell.condition(condition)
        block.decided = block.decided or block.taking

    def open(self, head: str, words: list[str]) -> None:
        """A loop, `case` or function definition: its body is not run here (noted where it would run)."""
        kind = "loop" if head in LOOPS else "case" if head == "case" else "function"
        if self.runs():
            text = " ".join(words)
            if kind == "function":
                name = words[1] if head == "function" and len(words) > 1 else head[:-2]
                self.functions.add(name)
                self.shell.note(f"the function {name} is not read: what it sets or starts when called is not "
                                "followed")
            elif OWN_ARGUMENTS.search(text) or kind == "case":
                self.shell.note(f"`{text}` ... `{'esac' if kind == 'case' else 'done'}` is not evaluated here "
                                "(option parsing over the script's own arguments: the variables it would set keep "
                                "the values set before it; write your run's values there)")
            else:
                self.shell.note(f"the loop `{text}` ... `done` is not run here: what it sets or starts is not read")
        self.blocks.append(_Block(kind))

    def command(self, words: list[str]) -> None:
        if words[0] in self.functions:
            self.shell.note(f"the call `{' '.join(words)}` of a function is not followed")
            return
        self.found = _run(self.shell, words, self.shell.line) or self.found


def find_launch(path: str, text: str, environ: dict[str, str] | None = None,
                arguments: Sequence[str] = ()) -> Launch | None:
    """Run the script's assignments and conditions in order, with `arguments` as its own, and return the command
    that starts a `*.py` program (the last one, if several), or None when the script starts none."""
    walk = _Walk(Shell(path, environ, arguments))
    for statement in statements(text):
        walk.shell.line = statement.line
        walk.statement(statement.words)
    if walk.found is not None:
        walk.found.notes, walk.found.shell = walk.shell.notes, walk.shell
    return walk.found


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
        shell.assign(name, raw, append=bool(append))
        return None
    if words and ASSIGNMENT.match(words[0]) and ASSIGNMENT.match(words[0])[3].startswith("<"):
        name = ASSIGNMENT.match(words[0])[1]
        shell.note(f"{name} is a placeholder ({' '.join(words)[len(name) + 1:]}) the script's user fills in: read "
                   "as empty")
        shell.assign(name, "")
        return None
    while words and ASSIGNMENT.match(words[0]):  # VAR=value command ...: an environment for the command
        words = words[1:]
    expanded = [w for raw in without_redirections(words) for w in shell.expand(raw)]
    if expanded[:1] == ["shift"]:
        shell.shift(expanded[1:])
        return None
    if not expanded or expanded[0] in SKIPPED_COMMANDS:
        return None
    if expanded[0] == "eval":  # its words joined, read as a script's statements
        launches = [_run(shell, inner.words, line) for inner in statements(" ".join(expanded[1:]))]
        return next((launch for launch in reversed(launches) if launch is not None), None)
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


Explain = Callable[[str], tuple[str, str | None]]
"""flag -> (file:line that writes it, where its value comes from when a variable of the script gives it)."""


def launcher_gpus(launcher: list[str], explain: Explain = lambda flag: ("", None)) -> int | None:
    """How many processes a launcher starts (python: 1; torchrun / torch.distributed.launch: nproc_per_node x
    nnodes; deepspeed: --num_gpus x --num_nodes or the GPUs of `-i host:0,1,...`); None when it does not say.
    `explain(flag)`: where a count is written and where its value comes from, for the error when it is not one."""
    options = _options(launcher)
    if not launcher or os.path.basename(launcher[0]).startswith("python") and "-m" not in launcher:
        return 1
    if "nproc_per_node" in options:
        nodes = _count(options, "nnodes", explain) if "nnodes" in options else 1
        return _count(options, "nproc_per_node", explain) * nodes
    if "num_gpus" in options:
        nodes = _count(options, "num_nodes", explain) if "num_nodes" in options else 1
        return _count(options, "num_gpus", explain) * nodes
    include = options.get("i") or options.get("include")
    if include:
        return sum(len(part.split(":")[1].split(",")) if ":" in part else 1 for part in include.split("@"))
    return None


def _count(options: dict[str, str], name: str, explain: Explain) -> int:
    """A launcher's count option as a whole number (its last `:`-part: torchrun's `--nnodes 1:4`)."""
    value = options[name].split(":")[-1]
    if value.isdigit() and int(value) > 0:
        return int(value)
    flag = f"--{name}"
    said = "has no value" if not value else f"{value!r} is not a whole number above 0"
    where, origin = explain(flag)
    raise UserError(f"{where + ': ' if where else ''}the launcher's {flag} {said}" +
                    (f" ({origin})" if origin else "; write the count into the script") +
                    "; or give migrate --num_gpus=N (the GPUs the run used).")


def _options(words: list[str]) -> dict[str, str]:
    """A launcher's options: `--name value`, `--name=value` (an option followed by another, or by nothing, has
    the value '')."""
    options = {}
    for k, word in enumerate(words):
        if word.startswith("-"):
            name, equals, value = word.lstrip("-").partition("=")
            following = words[k + 1] if k + 1 < len(words) and not words[k + 1].startswith("-") else ""
            options[name.replace("-", "_")] = value if equals else following
    return options
