#!/usr/bin/env python3
# Runs the ```bash blocks of README.md and docs/*.md, in order, one shell session per document; fails on a broken one.
"""
How a document's fenced blocks are treated:
  ```bash                      run, in order, in one bash session per document (set -e -o pipefail), so exports,
                               files and background servers of earlier blocks are there for later ones
  ```bash skip="REASON"        not run (needs a GPU, a real external server, the network or minutes); listed with
                               the reason
  ```bash requires="PATH"      run when PATH (relative to the source tree, e.g. a model scripts/setup.sh fetches)
                               exists, else listed as skipped; a failure under SERVETUNE_REQUIRE_MODELS=1, as in CI
  ```LANG file="NAME"          any block: its text is written to NAME (relative to the document's working folder)
                               at that point of the session, e.g. a sweep file a later bash block runs
  ```text, ```yaml, ...        not run
  ``` (no language), ```sh, ```shell, ```console
                               an error: a command block is tagged bash (run or skip), anything else names its language
The session runs in a scratch folder that mirrors the source tree (symlinks; results/ is a real folder holding links to
the committed results), with build/cpu/servetune and build/cpu/loadgen/servetune_mock_openai linked to the binaries
under test and build/cpu on PATH, so `servetune ...` and repo-relative paths work as in a checkout and nothing is
written into the source tree. Background processes a document starts are stopped when it ends. The examples listen
on fixed ports, so runs on one machine take turns (a lock file in the temp folder).
Exit status: 0 when every run block succeeded, 1 otherwise (with the failing block and its output), 2 for bad arguments.
"""

import argparse
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

RUN_LANG = "bash"
SHELL_LANGS = {"sh", "shell", "console", "zsh", "shell-session"}
FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")
ATTR = re.compile(r'([A-Za-z][\w-]*)="([^"]*)"')
DOC_TIMEOUT_S = 120
TOTAL_TIMEOUT_S = 240  # below the ctest TIMEOUT, so a hang is reported here and its processes are stopped
LOCK_WAIT_S = 120      # for another run of the examples on this machine to finish (they share ports)


class Block:
    def __init__(self, path, line, lang, attrs, text):
        self.path, self.line, self.lang, self.attrs, self.text = path, line, lang, attrs, text

    def where(self):
        return f"{self.path}:{self.line}"


def parse_blocks(path, text):
    """Fenced blocks of a Markdown text, and the problems found (untagged or shell-tagged command blocks)."""
    blocks, problems = [], []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or (m.group(2)[0] == "`" and "`" in m.group(3)):
            i += 1
            continue
        indent, fence, info = len(m.group(1)), m.group(2), m.group(3).strip()
        start = i + 1
        body = []
        i += 1
        while i < len(lines):
            close = FENCE.match(lines[i])
            if (close and close.group(2)[0] == fence[0] and len(close.group(2)) >= len(fence)
                    and not close.group(3).strip()):
                break
            line = lines[i]
            body.append(line[indent:] if line[:indent].strip() == "" else line)
            i += 1
        else:
            problems.append(f"{path}:{start}: the fenced block opened here is never closed")
        i += 1
        lang = info.split()[0] if info else ""
        attrs = dict(ATTR.findall(info[len(lang):]))
        block = Block(path, start, lang, attrs, "\n".join(body) + "\n")
        if not lang:
            problems.append(f"{block.where()}: a fenced block without a language (bash for commands, text for output)")
        elif lang in SHELL_LANGS:
            problems.append(f"{block.where()}: tag command blocks ```bash (run) or ```bash skip=\"REASON\", "
                            f"not ```{lang}")
        elif "skip" in attrs and (lang != RUN_LANG or not attrs["skip"].strip()):
            problems.append(f"{block.where()}: skip=\"REASON\" applies to bash blocks and needs a reason")
        elif "requires" in attrs and (lang != RUN_LANG or not attrs["requires"].strip()):
            problems.append(f"{block.where()}: requires=\"PATH\" applies to bash blocks and needs a path")
        elif "file" in attrs and (not attrs["file"] or attrs["file"].startswith("/")
                                  or ".." in attrs["file"].split("/")):
            problems.append(f"{block.where()}: file=\"NAME\" must be a relative path inside the working folder")
        blocks.append(block)
    return blocks, problems


def session_script(blocks):
    """One bash script that runs a document's blocks in order, printing a marker before each."""
    out = ["set -e -o pipefail", "__doc_block() { printf '\\n@@ block %s\\n' \"$1\"; }"]
    for n, b in enumerate(blocks):
        if "file" in b.attrs:
            delim = f"__DOC_FILE_{n}__"
            out.append(f"mkdir -p \"$(dirname '{b.attrs['file']}')\"")
            out.append(f"cat > '{b.attrs['file']}' <<'{delim}'\n{b.text}{delim}")
        elif b.lang == RUN_LANG and "skip" not in b.attrs:
            out.append(f"__doc_block {b.line}")
            out.append(b.text)
    out.append("__doc_block end")
    return "\n".join(out) + "\n"


def make_workdir(root, source, servetune, mock):
    """A folder that looks like the checkout: links to the source tree, a real results/ and build/cpu."""
    os.makedirs(root)
    for name in os.listdir(source):
        if name in ("build", "results", ".git"):
            continue
        os.symlink(os.path.join(source, name), os.path.join(root, name))
    os.makedirs(os.path.join(root, "results"))
    results = os.path.join(source, "results")
    if os.path.isdir(results):
        for name in os.listdir(results):
            os.symlink(os.path.join(results, name), os.path.join(root, "results", name))
    bindir = os.path.join(root, "build", "cpu")
    os.makedirs(os.path.join(bindir, "loadgen"))
    if servetune:
        os.symlink(os.path.abspath(servetune), os.path.join(bindir, "servetune"))
    if mock:
        os.symlink(os.path.abspath(mock), os.path.join(bindir, "loadgen", "servetune_mock_openai"))
    return bindir


def stop_group(proc):
    """Stops the session's process group (the shell and what it left running), SIGTERM first, then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 1.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()  # reap the shell: a zombie still counts as a member of the group
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def run_document(blocks, workdir, bindir, timeout_s):
    """Runs one document's session; returns (ok, seconds, log text, the failing block or None)."""
    script = os.path.join(workdir, ".doc-session.sh")
    with open(script, "w") as f:
        f.write(session_script(blocks))
    log_path = os.path.join(workdir, ".doc-session.log")
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["bash", script], cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        finally:  # also when the runner itself is stopped (SIGTERM from ctest's timeout, Ctrl-C)
            stop_group(proc)
            proc.wait()
    seconds = time.monotonic() - t0
    with open(log_path, errors="replace") as f:
        log_text = f.read()
    markers = re.findall(r"^@@ block (\S+)$", log_text, re.M)
    ok = code == 0 and markers and markers[-1] == "end"
    failed = None
    if not ok:
        last = markers[-1] if markers else None
        failed = next((b for b in blocks if str(b.line) == last), None)
        if code is None:
            log_text += f"\n(timed out after {timeout_s:g} s)\n"
        else:
            log_text += f"\n(exit status {code})\n"
    return ok, seconds, log_text, failed


def block_output(log_text, block):
    """The part of the session log that the block printed."""
    if block is None:
        return log_text
    start = log_text.find(f"\n@@ block {block.line}\n")
    return log_text[start:] if start >= 0 else log_text


def documents(source, names):
    if names:
        return [os.path.join(source, n) if not os.path.isabs(n) else n for n in names]
    docs = [os.path.join(source, "README.md")]
    docs_dir = os.path.join(source, "docs")
    if os.path.isdir(docs_dir):
        docs += sorted(os.path.join(docs_dir, n) for n in os.listdir(docs_dir) if n.endswith(".md"))
    return docs


LOCK_PATH = os.path.join(tempfile.gettempdir(), "servetune-doc-examples.lock")


def take_turn(wait_s, path=LOCK_PATH):
    """Waits until no other run of the examples holds the machine's lock; returns the open lock file, or None."""
    f = open(path, "a")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if time.monotonic() > deadline:
                f.close()
                return None
            time.sleep(0.5)


def main(argv=None):
    p = argparse.ArgumentParser(description="Run the bash examples of the documentation.")
    p.add_argument("--source", required=True, help="source tree (the repository root)")
    p.add_argument("--servetune", required=True, help="the servetune binary under test")
    p.add_argument("--mock", default="", help="the servetune_mock_openai binary")
    p.add_argument("--keep", action="store_true", help="keep the scratch folders")
    p.add_argument("--timeout", type=float, default=DOC_TIMEOUT_S, help="seconds per document")
    p.add_argument("--total-timeout", type=float, default=TOTAL_TIMEOUT_S, help="seconds for all documents")
    p.add_argument("--no-lock", action="store_true", help="do not wait for other runs (documents without fixed ports)")
    p.add_argument("docs", nargs="*", help="Markdown files (default: README.md and docs/*.md)")
    a = p.parse_args(argv)
    source = os.path.abspath(a.source)
    if not os.access(a.servetune, os.X_OK):
        print(f"run_doc_examples: --servetune {a.servetune}: not an executable file", file=sys.stderr)
        return 2

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    lock = None if a.no_lock else take_turn(LOCK_WAIT_S)  # held until the process exits
    if lock is None and not a.no_lock:
        print(f"run_doc_examples: another run of the examples held the lock for {LOCK_WAIT_S} s", file=sys.stderr)
        return 1
    scratch = tempfile.mkdtemp(prefix="servetune-docs-")
    try:
        failures, skipped, total_run, t0 = [], [], 0, time.monotonic()
        for doc in documents(source, a.docs):
            rel = os.path.relpath(doc, source)
            try:
                with open(doc) as f:
                    blocks, problems = parse_blocks(rel, f.read())
            except OSError as e:
                failures.append(f"{rel}: cannot read: {e}")
                continue
            if problems:
                failures += problems
                continue
            for b in blocks:
                need = b.attrs.get("requires")
                if need and "skip" not in b.attrs and not os.path.exists(os.path.join(source, need)):
                    if os.environ.get("SERVETUNE_REQUIRE_MODELS") == "1":
                        failures.append(f"{b.where()}: needs {need}, which is missing (SERVETUNE_REQUIRE_MODELS=1)")
                    b.attrs["skip"] = f"needs {need} (scripts/setup.sh fetches it)"
            skipped += [(b.where(), b.attrs["skip"]) for b in blocks if "skip" in b.attrs]
            to_run = [b for b in blocks if b.lang == RUN_LANG and "skip" not in b.attrs]
            if not to_run:
                print(f"{rel}: no blocks to run")
                continue
            left = a.total_timeout - (time.monotonic() - t0)
            if left <= 0:
                failures.append(f"{rel}: not run: the documents before it used up --total-timeout "
                                f"({a.total_timeout:g} s)")
                continue
            workdir = os.path.join(scratch, re.sub(r"[^\w.-]", "_", rel))
            bindir = make_workdir(workdir, source, a.servetune, a.mock)
            ok, seconds, log_text, failed = run_document(blocks, workdir, bindir, min(a.timeout, left))
            total_run += len(to_run)
            if ok:
                print(f"ok   {rel}: {len(to_run)} block(s) in {seconds:.1f} s")
                continue
            where = failed.where() if failed else rel
            text = failed.text if failed else ""
            output = block_output(log_text, failed)[-6000:]
            failures.append(f"{where}: this block failed:\n{text}--- its output:\n{output}")
            print(f"FAIL {rel} ({seconds:.1f} s)")
        for where, reason in skipped:
            print(f"skip {where}: {reason}")
        print(f"{total_run} block(s) run, {len(skipped)} skipped, {time.monotonic() - t0:.1f} s")
    finally:
        if a.keep:
            print(f"scratch folders kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    if failures and not a.keep:
        print("(run it again with --keep to keep the scratch folders)")
    for f in failures:
        print(f"\nFAILED {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
