#!/usr/bin/env python3
"""Writes a manual page (roff) from a program's Abseil `--help` text.

    help2roff.py --name=zenflowd --section=8 --version=0.1.0 --date="December 2026" \
        [--files=TEXT] [--see_also=zfctl(1)] < help.txt > zenflowd.8

The text is what `PROGRAM --help` prints, whatever its exit status: the
first line "PROGRAM: description", then "Flags from FILE:" sections whose
entries read "--flag (description); default: VALUE;" over indented lines.
Flags from Abseil's own files (--helpfull's) are not listed: they are not
in --help. The page has NAME, SYNOPSIS, DESCRIPTION, OPTIONS, FILES (when
given) and SEE ALSO. A help text in another form (no such flag entries, e.g.
a command with subcommands and its own usage text) goes into DESCRIPTION
as it is, preformatted.
"""

import argparse
import re
import sys


def roff(text):
    """Escapes text for roff: backslashes, hyphens and a leading dot or quote."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    if text[:1] in (".", "'"):
        text = "\\&" + text
    return text


def parse(help_text):
    lines = help_text.splitlines()
    if not lines:
        raise SystemExit("help2roff: the help text is empty")
    description = lines[0].split(":", 1)[1].strip() if ":" in lines[0] else lines[0].strip()
    flags = []  # (name, description, default)
    entry = None
    for line in lines[1:]:
        m = re.match(r"^    (--\S+) \((.*)$", line)
        if m:
            entry = [m.group(1), m.group(2)]
            flags.append(entry)
        elif entry is not None and line.startswith("      "):
            entry[1] += " " + line.strip()
        else:
            entry = None
    parsed = []
    for name, body in flags:
        m = re.match(r"^(.*)\); default: (.*);$", body)
        if m:
            parsed.append((name, m.group(1), m.group(2)))
        else:
            parsed.append((name, body.rstrip(");"), None))
    return description, parsed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--section", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--date", required=True)
    ap.add_argument("--summary", help="NAME line's text (default: the help's first line)")
    ap.add_argument("--files", default="", help="FILES section text; '; ' separates entries")
    ap.add_argument("--see_also", default="")
    args = ap.parse_args()
    help_text = sys.stdin.read()
    description, flags = parse(help_text)
    manual = "System Administration" if args.section == "8" else "User Commands"
    out = [f'.TH {args.name.upper()} {args.section} "{args.date}" '
           f'"{args.name} {args.version}" "{manual}"',
           ".SH NAME", f"{roff(args.name)} \\- {roff(args.summary or description)}",
           ".SH SYNOPSIS", f".B {roff(args.name)}", "[\\fIFLAGS\\fR]",
           ".SH DESCRIPTION"]
    if not flags:
        out += [".nf"] + [roff(line) for line in help_text.rstrip("\n").splitlines()] + [".fi"]
    else:
        out += [roff(description), ".PP",
                "Each flag is given as \\fB\\-\\-name=value\\fR (a boolean also as "
                "\\fB\\-\\-name\\fR or \\fB\\-\\-noname\\fR), on the command line or, one a "
                "line, in a file named by \\fB\\-\\-flagfile\\fR. \\fB\\-\\-helpfull\\fR lists "
                "the flags of the libraries too.",
                ".SH OPTIONS"]
    for name, text, default in flags:
        out += [".TP", f".B {roff(name)}", roff(text) + "."]
        if default is not None:
            out.append(f"Default: {roff(default)}.")
    if args.files:
        out.append(".SH FILES")
        for item in args.files.split("; "):
            path, _, what = item.partition(" ")
            out += [".TP", f".I {roff(path)}", roff(what)]
    if args.see_also:
        out += [".SH SEE ALSO", roff(args.see_also)]
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
