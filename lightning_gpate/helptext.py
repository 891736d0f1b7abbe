"""Help text as a user reads it: plain sentences, short enough to scan.

The command line's help is generated from docstrings (the models' ``Args``, Lightning's Trainer, the callbacks).
Docstrings here are written as plain text; what reStructuredText the help still meets (Lightning's own
docstrings, a cross-reference left in one of ours) :func:`plain_text` turns into the words a reader sees:
````x```` is ``x``, ``:class:`~pkg.mod.Name``` is ``Name``, a link is its text. :func:`first_sentence` keeps an
option's summary (the rest of its docstring is for the reader of the code), and :class:`PlainHelpFormatter`
applies both to every option, group title and description that ``--help`` prints.
"""

from __future__ import annotations

import re
import textwrap
from argparse import SUPPRESS, Action

from jsonargparse import DefaultHelpFormatter

#: ``:role:`target``` or ``:domain:role:`text <target>``` (Sphinx cross-references): a reader sees the name, not its
#: module path.
_ROLE = re.compile(r":(?:[a-z]+:)?[a-z]+:`(~?)([^`<]*?)\s*(?:<([^>`]*)>)?`")
#: ```text <url>`_`` (a reST link) and ```text`_``.
_LINK = re.compile(r"`([^`<]+?)\s*<([^>`]+)>`__?")
_NAMED_LINK = re.compile(r"`([^`]+)`__?")
_LITERAL = re.compile(r"``(.+?)``")
_DEFAULT_ROLE = re.compile(r"(?<![\w`])`([^`\s][^`]*?)`(?![\w`])")
_STRONG = re.compile(r"\*\*(\S(?:[^*]*\S)?)\*\*")
_EMPHASIS = re.compile(r"(?:(?<=[\s(])|^)\*(\w[^*]*?)\*(?=[\s.,;:)]|$)")
_CLASS_DEFAULT = re.compile(r"\{'class_path': '(?:[\w]+\.)*(\w+)'(?:, 'init_args': \{[^{}]*\})?\}")
#: A quoted key of a mapping given as a default (written as YAML writes it).
_DICT_KEY = re.compile(r"'(\w+)': ")
#: Types that an option's default names well enough.
_SELF_EVIDENT_TYPES = ("int", "float", "str", "bool")
#: Words after which a full stop does not end a sentence.
_ABBREVIATIONS = ("e.g", "i.e", "et al", "etc", "cf", "vs", "Eq", "Eqs", "Fig", "Sec", "approx", "resp", "No", "incl")


def plain_text(text: str | None) -> str:
    """``text`` with reStructuredText's markup replaced by what it shows, whitespace collapsed.

    >>> plain_text("the ``GaussAgg`` (:class:`~lightning_gpate.privacy.GaussAgg`), *its* `docs <https://x.org>`_")
    'the GaussAgg (GaussAgg), its docs (https://x.org)'
    """
    if not text:
        return ""
    if re.search(r"\n\s*\n", text.strip()):  # paragraphs stay paragraphs
        return "\n\n".join(plain_text(p) for p in re.split(r"\n\s*\n", text.strip()))
    text = " ".join(text.split())
    text = _ROLE.sub(lambda m: (m.group(2) or m.group(3) or "").strip().rpartition(".")[2], text)
    text = _LINK.sub(lambda m: f"{m.group(1)} ({m.group(2)})", text)
    text = _LITERAL.sub(r"\1", text)
    text = _NAMED_LINK.sub(r"\1", text)
    text = _DEFAULT_ROLE.sub(r"\1", text)
    text = _STRONG.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    return " ".join(text.split())


def first_sentence(text: str) -> str:
    """The first sentence of plain ``text``: up to the first full stop outside brackets that is followed by a space (or
    ends the text), not after an abbreviation (``e.g.``, ``et al.``). A text without one is returned whole.

    >>> first_sentence("seed of the noise (e.g. 3. Not secret). None: drawn from the OS. More.")
    'seed of the noise (e.g. 3. Not secret).'
    """
    depth = 0
    for i, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        elif char == "." and depth == 0:
            rest = text[i + 1:]
            if rest and rest[0] != " ":
                continue
            if any(text[:i].endswith(a) for a in _ABBREVIATIONS):
                continue
            return text[:i + 1]
    return text


def first_paragraph(docstring: str | None) -> str:
    """The first paragraph of a docstring (up to its first blank line), as plain text: a class's description."""
    lines = []
    for line in (docstring or "").strip().splitlines():
        if not line.strip():
            break
        lines.append(line)
    return plain_text(" ".join(lines))


def summary(text: str | None) -> str:
    """An option's or a group's summary: the first sentence of its plain text."""
    return first_sentence(plain_text(text))


class PlainHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help in plain text, an option in two lines or so: its name with its type and default, then its
    summary sentence (:func:`summary`) below it; group titles cut to their first clause, descriptions without
    markup; the data spec and linked arguments (set by the command line itself) and a nested class's ``.help`` left
    out (the option's own help names it); a usage line that gives the command's form instead of every option.

    Attributes:
        help_overrides: ``dest`` → the help to print instead of the docstring's (options whose docstring is another
            library's and misleads here).
        hidden: options a user of the command line never sets, by destination or its last parts: the data's spec
            (the command line links it into the model).
    """

    help_overrides: dict[str, str] = {}
    hidden: tuple[str, ...] = ("data_spec",)
    #: Where an option's summary starts, below its name.
    summary_indent = 4

    def _shown(self, action: Action) -> bool:
        from jsonargparse._actions import _ActionHelpClassPath
        from jsonargparse._link_arguments import ActionLink

        if isinstance(action, ActionLink) or action.help is SUPPRESS:
            return False
        if isinstance(action, _ActionHelpClassPath) and action.dest.count(".") > 1:  # --model.aggregator.help
            return False
        return not any(action.dest == name or action.dest.endswith(f".{name}") for name in self.hidden)

    def add_arguments(self, actions) -> None:
        super().add_arguments([a for a in actions if self._shown(a)])

    def add_usage(self, usage, actions, groups, prefix=None) -> None:
        if usage is SUPPRESS:
            return
        actions = [a for a in actions if self._shown(a)]
        if usage is None and sum(1 for a in actions if a.option_strings) > 8:  # a page of options: the command's form
            positionals = [self._format_args(a, a.dest) for a in actions if not a.option_strings]
            config = " [-c CONFIG]" if any("--config" in a.option_strings for a in actions) else ""
            usage = " ".join([f"{self._prog}{config} [--OPTION VALUE ...]", *positionals])
        super().add_usage(usage, actions, groups, prefix)

    def start_section(self, heading) -> None:
        super().start_section(_clause(summary(heading)) if heading else heading)

    def add_text(self, text) -> None:
        if text is not SUPPRESS and text is not None:
            text = plain_text(text)
        super().add_text(text)

    def _is_option(self, action: Action) -> bool:
        """An option that takes a value (not a help, a config file or the subcommands)."""
        from jsonargparse._actions import ActionConfigFile, _ActionConfigLoad

        return bool(action.option_strings) and not isinstance(action, (ActionConfigFile, _ActionConfigLoad, *_help_actions()))

    def _format_action(self, action: Action) -> str:
        if not self._is_option(action):
            return super()._format_action(action)
        text, _, facts = self._expand_help(action).partition(_FACTS)
        indent = " " * self._current_indent
        head = f"{indent}{self._format_action_invocation(action)}"
        if facts and len(head) + 3 + len(facts) <= self._width:
            head += f"  ({facts})"
        elif facts:
            text = f"({facts}) {text}".strip()
        body = textwrap.wrap(text, max(self._width, self._current_indent + self.summary_indent + 20),
                             initial_indent=indent + " " * self.summary_indent,
                             subsequent_indent=indent + " " * self.summary_indent, **_WRAP)
        return "\n".join([head, *body]) + "\n"

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, **_WRAP)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        """Each paragraph (parted by a blank line) filled on its own."""
        return "\n\n".join(textwrap.fill(" ".join(p.split()), width, initial_indent=indent, subsequent_indent=indent, **_WRAP)
                           for p in re.split(r"\n\s*\n", text) if p.strip())

    def _expand_help(self, action: Action) -> str:
        """jsonargparse's expansion, with a class given as a default (``{'class_path': 'pkg.GaussAgg', ...}``) named by
        its class and a mapping's keys unquoted."""
        return _DICT_KEY.sub(r"\1: ", _CLASS_DEFAULT.sub(lambda m: m.group(1), super()._expand_help(action)))

    def _format_action_invocation(self, action: Action) -> str:
        if not self._is_option(action):
            return super()._format_action_invocation(action)
        return ", ".join(o for o in action.option_strings if not o.endswith("+"))  # the type is on the line

    def _get_help_string(self, action: Action) -> str:
        """The summary, then (after :data:`_FACTS`, for :meth:`_format_action`) the type and default."""
        if getattr(action, "_jsonargparse_preexpanded_help", False):
            return action.help or ""
        override = self.help_overrides.get(action.dest)
        text = plain_text(override) if override is not None else summary(action.help)
        if not self._is_option(action) or override is not None:
            return text
        facts = ["required"] if action.required else []
        kind = self._get_type_str(action)
        has_default = action.default is not SUPPRESS and not action.required
        if kind is not None and not (has_default and action.default is not None and kind in _SELF_EVIDENT_TYPES):
            kind = _plain_type(kind)
            facts.append(kind.removesuffix(" | null") if has_default and action.default is None else kind)
        if has_default:
            facts.append("default: %(default)s")
        return f"{text}{_FACTS}{', '.join(facts)}" if facts else text


#: Lines break between words only: a name such as GS-WGAN or a command's option stays whole.
_WRAP = {"break_on_hyphens": False, "break_long_words": False}
#: Between an option's summary and its facts in the help string (split again when the option is formatted).
_FACTS = "\x00"


def _clause(text: str) -> str:
    """``text`` up to its first colon or full stop outside brackets: a group's title."""
    depth = 0
    for i, char in enumerate(text):
        depth += (char in "([{") - (char in ")]}")
        if depth == 0 and (char == ":" or (char == "." and text[i + 1:i + 2] in ("", " "))):
            return text[:i]
    return text


def _plain_type(kind: str) -> str:
    """jsonargparse's type string with ``Optional[X]`` written ``X | null`` and ``Union[X, Y]`` written ``X | Y``, at any
    depth (``Optional[dict[str, dict[str, Any]]]`` is ``dict[str, dict[str, Any]] | null``)."""
    for name, joined in (("Optional[", lambda parts: f"{parts[0]} | null"), ("Union[", " | ".join)):
        while (start := kind.find(name)) >= 0 and (start == 0 or not kind[start - 1].isalnum()):
            depth, parts, begin = 0, [], start + len(name)
            for i in range(begin, len(kind)):
                if kind[i] == "[":
                    depth += 1
                elif kind[i] == "]" and depth:
                    depth -= 1
                elif kind[i] == "]":
                    parts.append(kind[begin:i].strip())
                    break
                elif kind[i] == "," and not depth:
                    parts.append(kind[begin:i].strip())
                    begin = i + 1
            else:
                return kind  # unbalanced: as jsonargparse wrote it
            kind = kind[:start] + joined(parts) + kind[i + 1:]
    return kind


def _help_actions() -> tuple[type, ...]:
    from argparse import _HelpAction

    from jsonargparse._actions import _ActionHelpClassPath, _ActionPrintConfig

    return (_HelpAction, _ActionHelpClassPath, _ActionPrintConfig)
