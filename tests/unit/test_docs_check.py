"""tools/check_docs_html.py: raw reST roles and '::' markers in built HTML fail the docs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "check_docs_html.py"


@pytest.fixture(scope="module")
def check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_docs_html", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# what mkdocstrings makes of a reST docstring, and of the same one in Markdown
LEAKY = """<html><body><div class="doc">
<p>Use it like :class:<code>RingKernelRuntime</code>::</p>
<pre><code>async with rt: ...</code></pre>
<p>Returns :meth:`send` and a :py:func:<code>helper</code>.</p>
</div></body></html>"""
CLEAN = """<html><body><div class="doc">
<p>Use it like <code>RingKernelRuntime</code>:</p>
<div class="highlight"><pre><code>std::vector&lt;int&gt; v; // also :class:`X`::</code></pre></div>
<p>Namespaces such as <code>a::b</code>, a C++ name std::string in text, and
<code>:class:</code> inside code are fine. Admonition marker ::: is not a literal block.</p>
<script>var s = ":func:`x`::";</script>
</body></html>"""


def test_finds_roles_and_literal_markers(check: ModuleType) -> None:
    leaks = check.find_leaks(LEAKY, "page.html")
    kinds = sorted(leak.kind for leak in leaks)
    assert kinds == [
        "reST literal-block marker '::'",
        "reST role",
        "reST role",
        "reST role",
    ]
    assert all(leak.page == "page.html" for leak in leaks)
    assert "Use it like :class:" in str(leaks[0])


def test_code_scripts_and_cpp_scopes_are_not_leaks(check: ModuleType) -> None:
    assert check.find_leaks(CLEAN) == []


def _site(tmp_path: Path, pages: dict[str, str]) -> Path:
    for name, html in pages.items():
        page = tmp_path / "site" / name
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(html)
    return tmp_path / "site"


def test_main_fails_on_a_leak_and_names_the_page(
    check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = _site(tmp_path, {"a/index.html": CLEAN, "b/index.html": LEAKY})
    assert check.main([str(site)]) == 1
    out, err = capsys.readouterr()
    assert out.count("b/index.html: reST role") == 3
    assert "a/index.html" not in out
    assert "4 piece(s) of raw reST in the built docs" in err


def test_pending_pages_are_reported_not_failed(
    check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = _site(tmp_path, {"a/index.html": CLEAN, "b/index.html": LEAKY})
    pending = tmp_path / "pending.txt"
    pending.write_text("# converting\nb/index.html\na/index.html  # already clean\n")
    assert check.main([str(site), "--pending", str(pending)]) == 0
    out = capsys.readouterr().out
    assert "4 raw reST piece(s) on 1 pending page(s), not failed" in out
    assert "b/index.html" in out
    assert "no raw reST left on a/index.html: take them off" in out


def test_main_refuses_a_directory_without_html(
    check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check.main([str(tmp_path)]) == 2
    assert "no built HTML here; run mkdocs build first" in capsys.readouterr().err
