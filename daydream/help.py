"""``daydream --help`` (and ``daydream`` alone) printed as typer prints it, without importing
typer.rich_utils: that module imports rich's Markdown and Traceback (markdown-it, pygments),
which the top-level help never uses, and was half of the command's start-up.

What is printed comes from the typer app itself (its usage line, help, options and commands);
only the layout is typer's rich_format_help for a group, restated here with the same rich
renderables and styles. A group this does not know how to lay out (arguments, option
defaults, environment variables, help panels, deprecated commands, an epilog) is left to
typer. tests/daydream/test_output.py checks that both print the same, at several widths and
with colours.
"""

from __future__ import annotations

import inspect
import os

# typer.rich_utils' styles and highlighters, as typer 0.29 defines them
STYLES = {"option": "bold cyan", "switch": "bold green", "negative_option": "bold magenta",
          "negative_switch": "bold red", "types": "bold yellow", "types_sep": "dim",
          "usage": "yellow"}
OPTION_HIGHLIGHTS = [r"(^|\W)(?P<switch>\-\w+)(?![a-zA-Z0-9])",
                     r"(^|\W)(?P<option>\-\-[\w\-]+)(?![a-zA-Z0-9])",
                     r"(?P<types>\<[^\>]+\>)", r"(?P<usage>Usage: )"]
NEGATIVE_HIGHLIGHTS = [r"(^|\W)(?P<negative_switch>\-\w+)(?![a-zA-Z0-9])",
                       r"(^|\W)(?P<negative_option>\-\-[\w\-]+)(?![a-zA-Z0-9])"]
TYPES_HIGHLIGHTS = [r"^(?P<types_sep>(\[|<))", r"(?P<types_sep>\|)",
                    r"(?P<types_sep>(\]|>))(\.\.\.)?$"]


def _plain(group, ctx) -> bool:
    """Whether GROUP's help is one this module lays out as typer does."""
    if (group.deprecated or group.epilog or ctx.auto_envvar_prefix is not None
            or ctx.show_default or getattr(group, "rich_markup_mode", None) != "rich"):
        return False
    for p in group.get_params(ctx):
        if (p.param_type_name != "option" or p.secondary_opts or p.envvar is not None
                or p.required or getattr(p, "rich_help_panel", None) or p.show_default
                or p._get_number_range_help_str() or p.hidden):
            return False
    for name in group.list_commands(ctx):
        c = group.get_command(ctx, name)
        if c is None or c.hidden or c.deprecated or getattr(c, "rich_help_panel", None):
            return False
    return True


def print_help(app) -> bool:
    """The help of typer APP's top-level group on stdout, as typer prints it; False (nothing
    printed) where ``_plain`` says typer must print it."""
    import typer
    from rich.align import Align
    from rich.columns import Columns
    from rich.console import Console, Group
    from rich.highlighter import RegexHighlighter
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text
    from rich.theme import Theme
    from typer import _click

    group = typer.main.get_command(app)
    ctx = _click.Context(group, info_name=_click.utils._detect_program_name(),
                         **group.context_settings)
    if not _plain(group, ctx):
        return False

    def highlighter(patterns):
        return type("H", (RegexHighlighter,), {"highlights": patterns})()

    hl, neg, types = (highlighter(OPTION_HIGHLIGHTS), highlighter(NEGATIVE_HIGHLIGHTS),
                      highlighter(TYPES_HIGHLIGHTS))

    def rich_text(text: str, style: str = "") -> Text:
        text = inspect.cleandoc(text)
        return hl(Text.from_ansi(text, style=style) if "\033[" in text else
                  Text.from_markup(text, style=style))

    width = os.getenv("TERMINAL_WIDTH")
    force = True if (os.getenv("GITHUB_ACTIONS") or os.getenv("FORCE_COLOR")
                     or os.getenv("PY_COLORS")) else None
    if os.getenv("_TYPER_FORCE_DISABLE_TERMINAL"):
        force = False
    console = Console(theme=Theme(STYLES), highlighter=hl, color_system="auto",
                      force_terminal=force, width=int(width) if width else None)
    console.print(Padding(hl(group.get_usage(ctx)), 1), style="bold")
    if group.help:
        first, *rest = inspect.cleandoc(group.help).partition("\f")[0].split("\n\n")
        if not first.startswith("\b"):
            first = first.replace("\n", " ")
        parts = [rich_text(first.strip())]
        if rest:
            parts += [Text(""), rich_text("\n\n".join(rest), "dim")]
        console.print(Padding(Align(Group(*parts), pad=False), (0, 1, 1, 1)))

    def table(highlight: bool) -> Table:
        return Table(highlight=highlight, show_header=False, expand=True, box=None,
                     show_lines=False, leading=0, border_style=None, row_styles=None,
                     pad_edge=False, padding=(0, 1))

    options = table(True)
    for p in group.get_params(ctx):
        shown = Text(style="bold yellow", overflow="fold")
        t = p.display_type_rich(ctx=ctx)
        if t is not None:
            shown.append(t)
        helps = []
        if p.help:
            paras = [x.replace("\n", " ").strip() if not x.startswith("\b")
                     else "{}\n".format(x.strip("\b\n")) for x in p.help.split("\n\n")]
            helps.append(rich_text("\n".join(paras).strip()))
        options.add_row(hl(",".join(o for o in p.opts if "--" in o)),
                        hl(",".join(o for o in p.opts if "--" not in o)), neg(""), neg(""),
                        types(shown), Columns(helps))
    if options.row_count:
        console.print(Panel(options, border_style="dim", title="Options", title_align="left"))
    commands = [group.get_command(ctx, n) for n in group.list_commands(ctx)]
    listing = table(False)
    listing.add_column(style="bold cyan", no_wrap=True,
                       width=max((len(c.name or "") for c in commands), default=0))
    listing.add_column("Description", justify="left", no_wrap=False, ratio=10)
    for c in commands:
        first = inspect.cleandoc(c.short_help or c.help or "").split("\n\n")[0]
        if first.startswith("\b"):
            first = first.replace("\b\n", "")
        listing.add_row(Text(c.name or ""), rich_text(first.strip()))
    if listing.row_count:
        console.print(Panel(listing, border_style="dim", title="Commands", title_align="left"))
    return True
