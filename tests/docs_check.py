#!/usr/bin/python3
"""The documentation must not drift from the code: README.md and every docs/*.md page.

    docs_check.py SOURCE_DIR POSEMBED_BINARY

Checks, each of which fails if it finds nothing to check:
  examples  a fenced block after `<!-- FILE -->` is examples/FILE verbatim, and every file in
            examples/ is shown somewhere;
  config    a table after `<!-- config -->` is what `posembed config --markdown` prints;
  plan      a fenced block after `<!-- plan ARGS -->` is what `posembed plan ARGS` prints;
  cli       docs/cli.md is what scripts/cli_reference.sh writes from the program's own help;
  commands  every ```sh block is marked `<!-- run -->`, `<!-- run: exit N -->` or
            `<!-- not run: REASON -->` on the line before it; a block without a language that
            starts like a command must be labelled sh; `run` blocks are executed, each page's in
            page order in one scratch folder of its own, with the program as `posembed` on PATH
            and as ./build/posembed;
  verdicts  the claims table of docs/experiments.md has the verdicts of docs/experiments/REPORT.md;
  links     every relative link and image of the pages (and every plot of the report) exists,
            and a link to a heading (page.md#anchor) names a heading of that page.
Standard library only.
"""

import difflib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

SRC, POSEMBED = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
REGENERATE_CLI = "bash scripts/cli_reference.sh build/posembed > docs/cli.md"
# A fenced block without a language whose first line starts like one of these is a command.
COMMAND_START = re.compile(r"^(\$ )?(posembed |\./build/|build/|mpirun |bash |pip |python|cmake |git )")
# ... unless it is the program's own output, which starts "posembed plan: ..." (a word and a colon).
PROGRAM_OUTPUT = re.compile(r"^posembed \S+: ")
RUN_MARKER = re.compile(r"^<!-- run(?:: exit (\d+))? -->$")
NOT_RUN_MARKER = re.compile(r"^<!-- not run: (.*) -->$")
COMMAND_TIMEOUT_S = 120

failures = []


def fail(message):
    failures.append(message)
    print("FAIL: " + message)


def summarize(part, before, summary):
    """One line per part: what it checked, or how many problems it found."""
    found = len(failures) - before
    print(f"{part}: {summary}" if found == 0 else f"{part}: {found} problem(s) above")


def pages():
    docs = os.path.join(SRC, "docs")
    names = ["README.md"] + sorted("docs/" + n for n in os.listdir(docs) if n.endswith(".md"))
    return {name: open(os.path.join(SRC, name), encoding="utf-8").read().split("\n") for name in names}


def fences(lines):
    """Fenced blocks as (first line number 1-based of the opening fence, language, body lines)."""
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\S*)\s*$", lines[i])
        if m:
            start, body = i, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            if i == len(lines):
                fail(f"line {start + 1}: a ``` fence that is never closed")
            blocks.append((start + 1, m.group(1), body))
        i += 1
    return blocks


def block_after(lines, marker_index):
    """The fenced block that starts on the line right after a marker, or None."""
    for start, language, body in fences(lines):
        if start == marker_index + 2:
            return language, body
    return None


def diff_text(want, got, want_name, got_name):
    lines = list(difflib.unified_diff(want.split("\n"), got.split("\n"), want_name, got_name, lineterm=""))
    return "\n".join(lines[:40]) + ("\n..." if len(lines) > 40 else "")


def program(*args):
    r = subprocess.run([POSEMBED, *args], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"posembed {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def check_examples(all_pages):
    before = len(failures)
    shown, count = set(), 0
    for page, lines in all_pages.items():
        for i, line in enumerate(lines):
            m = re.match(r"^<!-- ([A-Za-z0-9_-]+\.[a-z]+) -->$", line)
            if not m:
                continue
            name, count = m.group(1), count + 1
            path = os.path.join(SRC, "examples", name)
            if not os.path.isfile(path):
                fail(f"{page}:{i + 1}: <!-- {name} --> names no file examples/{name}")
                continue
            block = block_after(lines, i)
            if block is None:
                fail(f"{page}:{i + 1}: no fenced block right after <!-- {name} -->")
                continue
            want = open(path, encoding="utf-8").read()
            got = "\n".join(block[1]) + "\n"
            if got != want:
                fail(f"{page}:{i + 1}: the block differs from examples/{name} (copy the file into it):\n"
                     + diff_text(want, got, f"examples/{name}", page))
            shown.add(name)
    if count == 0:
        fail("examples: no <!-- FILE --> example block in any page")
    for name in sorted(set(os.listdir(os.path.join(SRC, "examples"))) - shown):
        fail(f"examples/{name} is shown in no page (add it after a <!-- {name} --> marker)")
    summarize("examples", before, f"{count} blocks equal to examples/")


def check_config(all_pages):
    before = len(failures)
    want, count = program("config", "--markdown"), 0
    for page, lines in all_pages.items():
        for i, line in enumerate(lines):
            if line != "<!-- config -->":
                continue
            count += 1
            table = []
            for row in lines[i + 1:]:
                if not row.strip():
                    break
                table.append(row)
            got = "\n".join(table) + "\n"
            if got != want:
                fail(f"{page}:{i + 1}: the config table differs from `posembed config --markdown` "
                     "(paste its output here):\n" + diff_text(want, got, "posembed config --markdown", page))
    if count == 0:
        fail("config: no <!-- config --> table in any page")
    summarize("config", before, f"{count} table(s) equal to `posembed config --markdown`")


def check_plans(all_pages):
    before = len(failures)
    count = 0
    for page, lines in all_pages.items():
        for i, line in enumerate(lines):
            m = re.match(r"^<!-- plan (.*) -->$", line)
            if not m:
                continue
            count += 1
            block = block_after(lines, i)
            if block is None:
                fail(f"{page}:{i + 1}: no fenced block right after <!-- plan {m.group(1)} -->")
                continue
            want = program("plan", *shlex.split(m.group(1)))
            got = "\n".join(block[1]) + "\n"
            if got != want:
                fail(f"{page}:{i + 1}: the block is stale: paste the output of `posembed plan {m.group(1)}`:\n"
                     + diff_text(want, got, f"posembed plan {m.group(1)}", page))
    if count == 0:
        fail("plan: no <!-- plan ARGS --> block in any page")
    summarize("plan", before, f"{count} blocks equal to `posembed plan ARGS`")


def check_cli_reference():
    before = len(failures)
    r = subprocess.run(["bash", os.path.join(SRC, "scripts", "cli_reference.sh"), POSEMBED],
                       capture_output=True, text=True)
    if r.returncode != 0 or "## posembed " not in r.stdout:
        fail(f"scripts/cli_reference.sh failed ({r.returncode}): {r.stderr.strip()}")
        return
    got = open(os.path.join(SRC, "docs", "cli.md"), encoding="utf-8").read()
    if got != r.stdout:
        fail("docs/cli.md is not what the program's help says; regenerate it with\n    "
             + REGENERATE_CLI + "\n" + diff_text(r.stdout, got, "scripts/cli_reference.sh", "docs/cli.md"))
    commands = re.findall(r"^## posembed (\S+)$", r.stdout, re.M)
    summarize("cli", before, f"docs/cli.md equals the help of {len(commands)} commands")


def commands_of(body, first_line):
    """A block's commands as (line number, text), continuation lines joined, comments skipped."""
    out, pending, pending_line = [], "", 0
    for n, line in enumerate(body):
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not pending:
            pending_line = first_line + 1 + n
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((pending_line, pending + line))
        pending = ""
    return out


def run_command(page, line, command, scratch, env, want_rc):
    started = time.monotonic()
    try:
        r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=scratch, env=env,
                           capture_output=True, text=True, errors="replace",
                           timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        fail(f"{page}:{line}: `{command}` ran past {COMMAND_TIMEOUT_S} s")
        return False
    seconds = time.monotonic() - started
    if r.returncode != want_rc:
        tail = "\n".join((r.stdout + r.stderr).strip().split("\n")[-8:])
        fail(f"{page}:{line}: `{command}` exited {r.returncode}, the page says {want_rc}; "
             f"in {scratch}:\n{tail}")
        return False
    print(f"  {page}:{line}: {seconds:.1f} s, exit {r.returncode}: {command}")
    return True


def check_commands(all_pages, work):
    before = len(failures)
    bin_dir = os.path.join(work, "bin")
    os.makedirs(bin_dir)
    os.symlink(POSEMBED, os.path.join(bin_dir, "posembed"))
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""),
               OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "passive"))
    marked = ran = 0
    for page, lines in all_pages.items():
        scratch = None
        for start, language, body in fences(lines):
            marker = lines[start - 2] if start >= 2 else ""
            if language in ("bash", "shell", "console", "shell-session", "zsh"):
                fail(f"{page}:{start}: label command blocks ```sh, not ```{language}")
                continue
            if language == "":
                first = next((l for l in body if l.strip()), "")
                if COMMAND_START.match(first) and not PROGRAM_OUTPUT.match(first):
                    fail(f"{page}:{start}: a block without a language starts with a command "
                         f"({first!r}): label it sh and mark it run or not run")
                continue
            if language != "sh":
                continue
            marked += 1
            run, not_run = RUN_MARKER.match(marker), NOT_RUN_MARKER.match(marker)
            if not_run:
                if not not_run.group(1).strip():
                    fail(f"{page}:{start}: <!-- not run: REASON --> needs a reason")
                continue
            if not run:
                fail(f"{page}:{start}: a ```sh block needs <!-- run -->, <!-- run: exit N --> or "
                     f"<!-- not run: REASON --> on the line before it")
                continue
            commands = commands_of(body, start)
            if not commands:
                fail(f"{page}:{start}: a run block with no command")
                continue
            want_rc = int(run.group(1) or 0)
            if want_rc and len(commands) != 1:
                fail(f"{page}:{start}: a <!-- run: exit {want_rc} --> block holds one command, not {len(commands)}")
                continue
            if scratch is None:
                scratch = os.path.join(work, page.replace("/", "_"))
                os.makedirs(os.path.join(scratch, "build"))
                os.symlink(POSEMBED, os.path.join(scratch, "build", "posembed"))
            for line, command in commands:
                ran += 1
                if not run_command(page, line, command, scratch, env, want_rc):
                    break  # later commands of the page depend on this one
            else:
                continue
            break
    for page, lines in all_pages.items():
        inside = False
        for n, line in enumerate(lines):
            inside = inside != line.startswith("```")
            # An indented code block (four spaces after a blank line) is not a fence: no marker.
            if not inside and line.startswith("    ") and n and not lines[n - 1].strip() \
                    and COMMAND_START.match(line.strip()) and not PROGRAM_OUTPUT.match(line.strip()):
                fail(f"{page}:{n + 1}: an indented command ({line.strip()!r}): put it in a ```sh "
                     "block marked run or not run")
    if marked == 0 or ran == 0:
        fail(f"commands: {marked} sh blocks, {ran} commands run: expected some of each")
    summarize("commands", before, f"{marked} sh blocks marked, {ran} commands run")


def check_verdicts(all_pages):
    before = len(failures)
    page = "docs/experiments.md"
    text = "\n".join(all_pages.get(page, []))
    ours = re.findall(r"^\| ([1-9]) \| [^|]* \| ([a-z ]+) \| ", text, re.M)
    report = open(os.path.join(SRC, "docs", "experiments", "REPORT.md"), encoding="utf-8").read()
    theirs = re.findall(r"^\| ([1-9]) \| \[[^|]*\]\([^)]*\) \| \*\*([a-z ]+)\*\* \| ", report, re.M)
    if not theirs:
        fail("verdicts: docs/experiments/REPORT.md has no verdict table")
    elif ours != theirs:
        fail(f"verdicts: {page} says {ours}, docs/experiments/REPORT.md says {theirs}")
    summarize("verdicts", before, f"{len(ours)} claims agree with docs/experiments/REPORT.md")


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # headings only outside code
    return {slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}


def check_links(all_pages):
    before = len(failures)
    count = 0
    for page, lines in all_pages.items():
        text = "\n".join(lines)
        text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
        here = os.path.dirname(os.path.join(SRC, page))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:
            count += 1
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(here, path)) if path else os.path.join(SRC, page)
            if not os.path.exists(full):
                fail(f"{page}: link to {target}: no such file {os.path.relpath(full, SRC)}")
            elif anchor and full.endswith(".md") and anchor not in anchors(full):
                fail(f"{page}: link to {target}: {os.path.relpath(full, SRC)} has no heading #{anchor}")
    report_dir = os.path.join(SRC, "docs", "experiments")
    report = open(os.path.join(report_dir, "REPORT.md"), encoding="utf-8").read()
    for image in re.findall(r"\(([a-z_0-9]+\.png)\)", report):
        count += 1
        if not os.path.isfile(os.path.join(report_dir, image)):
            fail(f"docs/experiments/REPORT.md shows missing {image}")
    if count == 0:
        fail("links: no relative link in any page")
    summarize("links", before, f"{count} relative links and images resolve")


def main():
    all_pages = pages()
    check_examples(all_pages)
    check_config(all_pages)
    check_plans(all_pages)
    check_cli_reference()
    check_verdicts(all_pages)
    check_links(all_pages)
    work = tempfile.mkdtemp(prefix="posembed-docs-")
    check_commands(all_pages, work)
    if failures:
        print(f"\n{len(failures)} problem(s) in the docs; the run blocks' files are in {work}")
        sys.exit(1)
    shutil.rmtree(work)
    print(f"docs: README.md and {len(all_pages) - 1} pages in docs/ match the code")


if __name__ == "__main__":
    main()
