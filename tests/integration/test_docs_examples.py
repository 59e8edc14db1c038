"""Every ```python block in README.md and docs/ runs, so the docs cannot drift from the code.

Each block is a complete program and runs in its own interpreter (a fresh process, the
working directory a temporary folder, the repository on ``PYTHONPATH``); it passes when it
exits with status 0. An HTML comment on the line right before the opening fence marks a
block that cannot run everywhere (the convention is also described in
``docs/index.md``, "Conventions in these pages")::

    <!-- requires: cuda -->       a CUDA GPU usable through CuPy
    <!-- requires: metal -->      an Apple GPU through MLX (Metal)
    <!-- requires: mlx -->        MLX importable (the CPU build is enough)
    <!-- requires: numba -->      Numba CUDA importable (compiles PTX without a GPU)
    <!-- requires: ray -->        Ray importable (the block starts a local instance)
    <!-- requires: observability -->  the observability extra (Prometheus client, OpenTelemetry
                                  API and SDK)
    <!-- requires: cuda, ray -->  several requirements, comma-separated
    <!-- skip: fragment -->       not a program (a signature, a shape); keep these rare

A block whose requirement is missing is skipped with the reason; a ``skip`` block is
skipped with its text. Any other comment is ignored.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^(?P<indent>[ ]{0,3})```+\s*(?P<lang>[\w+-]*)")
_MARK = re.compile(r"<!--\s*(?P<kind>requires|skip)\s*:\s*(?P<value>.*?)\s*-->")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    code: str
    requires: tuple[str, ...]
    skip: str | None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    files = [ROOT / "README.md"] if (ROOT / "README.md").exists() else []
    return files + sorted((ROOT / "docs").rglob("*.md"))


def extract(path: Path) -> list[Block]:
    """The ```python blocks of a Markdown file, with the marker comment before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence = lines[i].strip()
        ticks = fence[: len(fence) - len(fence.lstrip("`"))]
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(ticks):
            body.append(
                lines[i][len(m["indent"]) :] if lines[i].startswith(m["indent"]) else lines[i]
            )
            i += 1
        i += 1  # closing fence
        if m["lang"].lower() not in ("python", "py"):
            continue
        requires: tuple[str, ...] = ()
        skip = None
        prev = start - 1
        while prev >= 0 and not lines[prev].strip():
            prev -= 1
        if prev >= 0 and (mark := _MARK.search(lines[prev])):
            if mark["kind"] == "requires":
                requires = tuple(r.strip().lower() for r in mark["value"].split(",") if r.strip())
            else:
                skip = mark["value"] or "marked skip"
        blocks.append(Block(path, start + 1, "\n".join(body) + "\n", requires, skip))
    return blocks


def all_blocks() -> list[Block]:
    return [b for path in doc_files() for b in extract(path)]


@cache
def missing(requirement: str) -> str | None:
    """None when ``requirement`` is met here, else why not."""
    if requirement == "cuda":
        code = "import cupy; assert cupy.cuda.runtime.getDeviceCount() > 0"
        ok = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
        return None if ok.returncode == 0 else "needs a CUDA GPU (CuPy found none)"
    if requirement in ("mlx", "metal"):
        if importlib.util.find_spec("mlx") is None:
            return "needs MLX: pip install 'pydotcompute[metal]'"
        if requirement == "metal":
            code = "import mlx.core as mx; assert mx.metal.is_available()"
            ok = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
            return None if ok.returncode == 0 else "needs an Apple GPU (Metal)"
        return None
    if requirement == "ray":
        if importlib.util.find_spec("ray") is None:
            return "needs Ray: pip install 'pydotcompute[ray]'"
        return None
    if requirement == "observability":
        for module in ("prometheus_client", "opentelemetry", "opentelemetry.sdk"):
            if importlib.util.find_spec(module) is None:
                return "needs the observability extra: pip install '.[observability]'"
        return None
    if requirement == "numba":
        if importlib.util.find_spec("numba") is None:
            return "needs Numba CUDA: pip install 'pydotcompute[cuda]'"
        return None
    return f"unknown requirement {requirement!r} (see the docstring of this test file)"


BLOCKS = all_blocks()


def test_docs_have_python_blocks() -> None:
    assert len(BLOCKS) >= 10, [b.id for b in BLOCKS]


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block_runs(block: Block, tmp_path: Path) -> None:
    if block.skip is not None:
        pytest.skip(f"marked skip: {block.skip}")
    for req in block.requires:
        reason = missing(req)
        if reason is not None:
            pytest.skip(reason)
    script = tmp_path / "block.py"
    script.write_text(block.code, encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=110,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, (
        f"the block at {block.id} failed (exit {proc.returncode}):\n{block.code}\n"
        f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    )


def test_markers_are_parsed(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- requires: cuda, ray -->\n```python\nprint(1)\n```\n\n"
        "<!-- skip: fragment -->\n\n```python\nx\n```\n\n```bash\nls\n```\n\n```py\npass\n```\n"
    )
    blocks = extract(page)
    assert [(b.line, b.requires, b.skip) for b in blocks] == [
        (4, ("cuda", "ray"), None),
        (10, (), "fragment"),
        (18, (), None),
    ]
    assert blocks[0].code == "print(1)\n"
    assert missing("warp-drive") is not None
