#!/usr/bin/env python3
# Tests of run_doc_examples.py on small documents: a broken example fails the run, skips are listed, bad tags refused.
import contextlib
import io
import os
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_doc_examples as runner  # noqa: E402

FENCE = "```"


def doc(*parts):
    return "\n".join(parts) + "\n"


class DocRunnerTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.source = self.tmp.name
        self.fake = os.path.join(self.source, "fake-servetune")
        with open(self.fake, "w") as f:
            f.write("#!/bin/sh\necho \"servetune $*\"\n")
        os.chmod(self.fake, 0o755)

    def tearDown(self):
        self.tmp.cleanup()

    def run_docs(self, text, *args):
        path = os.path.join(self.source, "doc.md")
        with open(path, "w") as f:
            f.write(text)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = runner.main(["--source", self.source, "--servetune", self.fake, "--timeout", "20", "--no-lock",
                                *args, "doc.md"])
        return code, out.getvalue(), err.getvalue()

    def test_passing_blocks_share_one_session(self):
        code, out, _ = self.run_docs(doc(
            "Intro", f"{FENCE}bash", "export GREETING=hello", "servetune --version", FENCE,
            f"{FENCE}yaml file=\"conf/a.yaml\"", "name: a", FENCE,
            f"{FENCE}bash", "test \"$GREETING\" = hello", "grep -q 'name: a' conf/a.yaml", FENCE))
        self.assertEqual(code, 0, out)
        self.assertIn("2 block(s) run", out)

    def test_a_failing_block_fails_and_is_named(self):
        code, out, err = self.run_docs(doc(
            f"{FENCE}bash", "true", FENCE, "", f"{FENCE}bash", "echo before-the-failure", "false", "echo never", FENCE))
        self.assertEqual(code, 1)
        self.assertIn("doc.md:5: this block failed", err)
        self.assertIn("before-the-failure", err)
        self.assertNotIn("\nnever", err)

    def test_a_failure_inside_a_pipeline_fails(self):
        code, _, err = self.run_docs(doc(f"{FENCE}bash", "false | cat", FENCE))
        self.assertEqual(code, 1, err)

    def test_skipped_blocks_are_listed_not_run(self):
        code, out, _ = self.run_docs(doc(f"{FENCE}bash skip=\"needs a GPU\"", "exit 1", FENCE,
                                         f"{FENCE}text", "x", FENCE))
        self.assertEqual(code, 0)
        self.assertIn("skip doc.md:1: needs a GPU", out)

    def test_untagged_and_shell_tagged_blocks_are_refused(self):
        for opening in (FENCE, f"{FENCE}sh", f"{FENCE}console"):
            code, _, err = self.run_docs(doc(opening, "servetune bench", FENCE))
            self.assertEqual(code, 1, opening)
            self.assertIn("doc.md:1", err)

    def test_requires_runs_with_the_file_and_skips_without_it(self):
        text = doc(f"{FENCE}bash requires=\"models/m.gguf\"", "echo ran > ran.txt; false", FENCE)
        old = os.environ.pop("SERVETUNE_REQUIRE_MODELS", None)
        try:
            code, out, _ = self.run_docs(text)
            self.assertEqual(code, 0)
            self.assertIn("skip doc.md:1: needs models/m.gguf", out)
            os.environ["SERVETUNE_REQUIRE_MODELS"] = "1"
            code, _, err = self.run_docs(text)
            self.assertEqual(code, 1)
            self.assertIn("SERVETUNE_REQUIRE_MODELS=1", err)
            os.makedirs(os.path.join(self.source, "models"))
            open(os.path.join(self.source, "models", "m.gguf"), "w").close()
            code, _, err = self.run_docs(text)
            self.assertEqual(code, 1)  # present: the block runs (and its `false` fails)
            self.assertIn("doc.md:1: this block failed", err)
        finally:
            os.environ.pop("SERVETUNE_REQUIRE_MODELS", None)
            if old is not None:
                os.environ["SERVETUNE_REQUIRE_MODELS"] = old

    def test_a_skip_without_reason_is_refused(self):
        code, _, err = self.run_docs(doc(f"{FENCE}bash skip=\"\"", "true", FENCE))
        self.assertEqual(code, 1)
        self.assertIn("needs a reason", err)

    def test_background_processes_are_stopped_and_hangs_time_out(self):
        marker = os.path.join(self.source, "still-running")
        code, _, err = self.run_docs(doc(f"{FENCE}bash", f"(sleep 1; touch {marker}) &", "sleep 30", FENCE),
                                     "--timeout", "0.5")
        self.assertEqual(code, 1)
        self.assertIn("timed out", err)
        time.sleep(1.5)
        self.assertFalse(os.path.exists(marker), "a background process of the document outlived it")

    def test_runs_take_turns(self):
        path = os.path.join(self.source, "lock")
        first = runner.take_turn(0, path)
        self.assertIsNotNone(first)
        self.assertIsNone(runner.take_turn(0.2, path))  # held: a second run waits, then gives up
        first.close()
        second = runner.take_turn(0, path)
        self.assertIsNotNone(second)
        second.close()

    def test_nested_fences_and_indented_blocks(self):
        blocks, problems = runner.parse_blocks("d.md", doc(
            "````markdown", "```bash", "inner", "```", "````", "1. step", "   ```bash", "   echo indented", "   ```"))
        self.assertEqual(problems, [])
        self.assertEqual([b.lang for b in blocks], ["markdown", "bash"])
        self.assertEqual(blocks[1].text, "echo indented\n")

    def test_source_tree_is_not_written(self):
        code, out, _ = self.run_docs(doc(f"{FENCE}bash", "mkdir -p results/x && touch results/x/file",
                                         "ls build/cpu/servetune", FENCE))
        self.assertEqual(code, 0, out)
        self.assertFalse(os.path.exists(os.path.join(self.source, "results", "x")))


if __name__ == "__main__":
    unittest.main()
