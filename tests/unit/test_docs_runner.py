"""The documentation runner (tests/_docs.py) itself: what it takes for code, what its directives do, and
that a documented block that stops working fails the documentation test, naming the block."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from _docs import SERVING, DocBlockFailed, DocRunner, blocks, commands

PAGE = '''# A page

```python
print("one")
```

Output, not code:

```text
$ pgstreams topics list
```

<!-- doc-test: skip the two commands themselves take minutes -->
```bash
./demo.sh
```

<!-- doc-test: file mymod.py -->
```python
def value():
    return 41
```

<!-- doc-test: setup
import mymod
-->
```python
assert mymod.value() + 1 == 42, "the file block was not written"
```

```sh
# a comment line
printf 'a\\n' \\
  | wc -l
```
'''


def _runner(tmp_path: Path) -> DocRunner:
    return DocRunner(tmp_path / "work", dict(os.environ, PGSTREAMS_DSN="postgresql://unused"), timeout=60)


def test_blocks_are_parsed_with_their_language_line_and_directives(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    got = blocks(page)
    assert [(b.lang, b.line) for b in got] == [("python", 3), ("text", 9), ("bash", 14), ("python", 19),
                                               ("python", 27), ("sh", 31)]
    assert got[2].directives == {"skip": "the two commands themselves take minutes"}
    assert got[3].directives == {"file": "mymod.py"}
    assert got[4].directives == {"setup": "import mymod"}
    assert [b.runs for b in got] == [True, False, False, False, True, True]
    assert commands(got[5].code) == ["printf 'a\\n'    | wc -l"]
    assert got[2].first_line == "./demo.sh" and got[0].where == "page.md:3"


def test_a_page_that_works_runs_every_code_block_and_lists_the_skipped_ones(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    runner = _runner(tmp_path)
    runner.run_page(page)
    assert [b.line for b in runner.ran] == [3, 27, 31]
    assert [b.first_line for b in runner.skipped] == ["./demo.sh"]
    assert (tmp_path / "work" / "mymod.py").read_text().startswith("def value")


def test_a_documented_block_that_stops_working_fails_naming_its_page_and_line(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(PAGE.replace("return 41", "return 40"))  # broken on purpose: the assertion block fails
    runner = _runner(tmp_path)
    with pytest.raises(DocBlockFailed) as failed:
        runner.run_page(page)
    assert failed.value.block.line == 27
    message = str(failed.value)
    assert "page.md:27 (python)" in message and "the file block was not written" in message
    assert [b.line for b in runner.ran] == [3]  # the blocks before it ran, none after it


def test_a_failing_shell_command_and_a_syntax_error_fail_the_page(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```sh\ntrue\nfalse | cat\n```\n")
    with pytest.raises(DocBlockFailed, match=r"page.md:1 \(sh\): false \| cat: exit code 1"):
        _runner(tmp_path).run_page(page)
    page.write_text("```python\nasync with x:\n    pass\n```\n")
    with pytest.raises(DocBlockFailed, match="SyntaxError"):
        _runner(tmp_path).run_page(page)


def test_a_serving_command_must_keep_running_until_stopped(tmp_path: Path) -> None:
    assert "pgstreams console" in SERVING
    page = tmp_path / "page.md"
    # a "worker" whose handler cannot be imported exits at once: the page fails
    page.write_text("```sh\npgstreams worker nosuchmodule:handle --topic t --group g\n```\n")
    with pytest.raises(DocBlockFailed, match=r"exited \(\d+\) before it was stopped"):
        _runner(tmp_path).run_page(page)


def test_a_block_without_a_language_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```\npgstreams topics list\n```\n")
    with pytest.raises(DocBlockFailed, match="needs a language"):
        _runner(tmp_path).run_page(page)


def test_a_skip_without_a_reason_and_a_stray_directive_are_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- doc-test: skip -->\n```sh\ntrue\n```\n")
    with pytest.raises(DocBlockFailed, match="must say why"):
        _runner(tmp_path).run_page(page)
    page.write_text("<!-- doc-test: skip slow -->\nsome prose\n```sh\ntrue\n```\n")
    with pytest.raises(ValueError, match="just before a block"):
        blocks(page)


def test_notebook_mode_shares_names_between_blocks_and_names_the_failing_one(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\nx = 41\n```\n\n```python\nx += 1\nprint('x is', x)\n```\n\n"
                    "```python\nassert x == 43, 'x is not 43'\n```\n")
    runner = DocRunner(tmp_path / "work", dict(os.environ), timeout=60, notebook=True)
    with pytest.raises(DocBlockFailed, match=r"page.md:10 \(python\): raised") as failed:
        runner.run_page(page)
    assert "x is not 43" in str(failed.value) and "x is 42" in str(failed.value)
    assert [b.line for b in runner.ran] == [1, 5]
