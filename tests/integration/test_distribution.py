"""The package as users get it: the sdist and wheel `make dist` builds, installed outside
the checkout, and the extras its documentation promises.

The sdist and the wheel are built once for the module (``python -m build``, what
``make dist`` runs: the sdist first, then the wheel from the sdist, so a file the sdist
forgets breaks the build here) from a copy of the checkout, so the checkout is not written
to. The wheel is then installed into a fresh virtual environment in a temporary folder
(no ``--system-site-packages``, no editable install; pip fetches NumPy and msgspec from the
index, or its cache) and the README's quick start and ``python -m pydotcompute info`` run
from there. A second fresh environment builds the wheel from the sdist with neither
Cython nor a working C compiler and checks that the pure-Python twins take over.

About a minute on a 2-core machine (most of it compiling the four extensions).
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import pydotcompute

from .test_docs_examples import Block, doc_files, extract

ROOT = Path(__file__).resolve().parents[2]
VERSION = pydotcompute.__version__
NATIVE = "pydotcompute/ring_kernels/_native"
#: the compiled modules setup_cython.py declares (one .so each in the wheel)
EXTENSIONS = ("fast_spsc", "fast_message", "fast_telemetry", "fast_queue_core")

pytestmark = pytest.mark.timeout(900)  # one build, two environments: well past the default


def _env(**extra: str) -> dict[str, str]:
    """The environment for a fresh interpreter: nothing that would point it back at the
    checkout or change which implementation it picks."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    env = {
        k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PYDOTCOMPUTE_")
    }
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


def _run(
    cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None, stderr: bool = False
) -> str:
    """Run ``cmd`` (by default in `_env`); its standard output (with ``stderr``, followed by
    its standard error), or a failure that shows both."""
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        env=_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}"
        f"\n--- stderr\n{proc.stderr[-6000:]}"
    )
    return proc.stdout + proc.stderr if stderr else proc.stdout


@dataclass(frozen=True)
class Dists:
    sdist: Path
    wheel: Path


def _copy_checkout(dest: Path) -> Path:
    """The checkout without what building or testing it leaves behind."""
    ignore = shutil.ignore_patterns(
        ".git",
        ".venv*",
        "build",
        "dist",
        "site",
        "*.egg-info",
        "__pycache__",
        "*.so",
        "*.c",
        ".*_cache",
        ".hypothesis",
        ".whl",
        "gpu-check-out",
        "results",
    )
    shutil.copytree(ROOT, dest, ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    if importlib.util.find_spec("build") is None:
        pytest.fail("the `build` package is missing: pip install -e '.[test]' (make install)")
    work = tmp_path_factory.mktemp("dist")
    src = _copy_checkout(work / "src")
    out = work / "out"
    # this environment as it is: PYTHONPATH may be how `build` is found
    build = [sys.executable, "-m", "build", "--outdir", str(out), str(src)]
    _run(build, cwd=work, env=dict(os.environ))
    (sdist,) = out.glob(f"pydotcompute-{VERSION}.tar.gz")
    (wheel,) = out.glob(f"pydotcompute-{VERSION}-*.whl")
    return Dists(sdist, wheel)


def _venv(where: Path) -> Path:
    """A fresh virtual environment (pip only); its python."""
    _run([sys.executable, "-m", "venv", str(where)], cwd=where.parent)
    return where / "bin" / "python"


def _pip(python: Path, *args: str) -> str:
    return _run([str(python), "-m", "pip", "install", "-q", *args], cwd=python.parent)


def _distributions(python: Path) -> set[str]:
    code = "import importlib.metadata as m; print('\\n'.join(d.name for d in m.distributions()))"
    out = _run([str(python), "-c", code], cwd=python.parent)  # not the checkout: its egg-info
    return {re.sub(r"[-_.]+", "-", n).lower() for n in out.split()}


@dataclass(frozen=True)
class Installed:
    python: Path
    home: Path  # a folder outside the checkout to run from
    distributions: set[str]  # what the plain install brought


@pytest.fixture(scope="module")
def installed(dists: Dists, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    home = tmp_path_factory.mktemp("user")
    python = _venv(home / "venv")
    before = _distributions(python)
    _pip(python, str(dists.wheel))
    return Installed(python, home, _distributions(python) - before)


def _python_in(installed: Installed, code: str) -> str:
    script = installed.home / "snippet.py"
    script.write_text(code, encoding="utf-8")
    return _run([str(installed.python), str(script)], cwd=installed.home)


# --- what the archives hold --------------------------------------------------------------


def test_the_wheel_has_the_compiled_extensions_their_sources_and_the_type_marker(
    dists: Dists,
) -> None:
    names = set(zipfile.ZipFile(dists.wheel).namelist())
    for ext in EXTENSIONS:
        built = [n for n in names if re.fullmatch(rf"{NATIVE}/{ext}\.cpython-[^/]+\.so", n)]
        assert built, f"no compiled {ext} in {dists.wheel.name}: {sorted(names)}"
    sources = sorted(
        p.relative_to(ROOT).as_posix()
        for pattern in ("*.pyx", "*.pxd")
        for p in (ROOT / NATIVE).glob(pattern)
    )
    assert len(sources) >= len(EXTENSIONS), sources
    assert set(sources) <= names, set(sources) - names
    assert "pydotcompute/py.typed" in names
    assert not [n for n in names if n.endswith(".c")], "generated C belongs in the sdist only"
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "examples/"))]
    assert re.fullmatch(
        rf"pydotcompute-{re.escape(VERSION)}-cp\d+-cp\d+-\w+\.whl", dists.wheel.name
    )


def test_the_wheel_metadata_is_this_release(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as whl:
        meta = whl.read(f"pydotcompute-{VERSION}.dist-info/METADATA").decode()
    assert re.search(rf"^Version: {re.escape(VERSION)}$", meta, re.M)
    assert VERSION.startswith("0.3.")
    requires = re.findall(r"^Requires-Dist: ([\w.-]+)(?:[^;\n]*)$", meta, re.M)
    assert sorted(requires) == ["msgspec", "numpy"], requires  # the core, without extras
    assert "Provides-Extra: observability" in meta


def test_the_sdist_carries_what_building_it_needs(dists: Dists) -> None:
    with tarfile.open(dists.sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for needed in ("pyproject.toml", "setup.py", "setup_cython.py", "README.md", "LICENSE"):
        assert needed in names, needed
    for ext in EXTENSIONS:
        assert f"{NATIVE}/{ext}.pyx" in names
        assert f"{NATIVE}/{ext}.c" in names, f"{ext}.c: a build without Cython compiles it"


def test_the_install_lines_name_the_wheel_this_release_builds(dists: Dists) -> None:
    """The README and the installation page say ``pip install dist/pydotcompute-X-*.whl``
    with X this version: a version bump that forgets them fails here."""
    line = f"pip install dist/pydotcompute-{VERSION}-*.whl"
    for page in (ROOT / "README.md", ROOT / "docs" / "getting-started" / "installation.md"):
        text = page.read_text(encoding="utf-8")
        assert line in text, f"{page.name}: no `{line}`"
        assert "0.2.0" in text, f"{page.name}: say why `pip install pydotcompute` gets 0.2.0"
    assert fnmatch.fnmatch(f"dist/{dists.wheel.name}", line.split()[-1])


# --- installed outside the checkout ------------------------------------------------------


def test_the_wheel_needs_only_numpy_and_msgspec(installed: Installed) -> None:
    assert installed.distributions == {"pydotcompute", "numpy", "msgspec"}


def _readme_quick_start() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "README.md: no python block under '## Quick start'"
    return code.group(1)


def test_the_readme_quick_start_runs_from_the_wheel(installed: Installed) -> None:
    out = _python_in(installed, _readme_quick_start())
    assert out.strip().splitlines()[-1] == "6.0", out
    where = _python_in(
        installed,
        "import pydotcompute\n"
        "from pydotcompute import RingKernelRuntime\n"
        "from pydotcompute.ring_kernels import _native as n\n"
        "print(pydotcompute.__file__)\n"
        "print(pydotcompute.__version__)\n"
        "print(hasattr(RingKernelRuntime, 'serve_metrics'))\n"
        "print(n.IMPLEMENTATION, n.message_extension() is not None,\n"
        "      n.telemetry_extension() is not None, n.queue_extension() is not None)\n",
    ).split("\n")
    assert Path(where[0]).is_relative_to(installed.home / "venv"), where[0]
    assert not Path(where[0]).is_relative_to(ROOT)
    assert where[1:4] == [VERSION, "True", "cython True True True"], where


def test_info_runs_from_the_wheel(installed: Installed) -> None:
    for cmd in (
        [str(installed.python), "-m", "pydotcompute", "info"],
        [str(installed.python.parent / "pydotcompute"), "info"],  # the console script
    ):
        out = _run(cmd, cwd=installed.home)
        assert out.startswith(f"pydotcompute {VERSION} "), out
        assert re.search(r"process\s+yes\s+shared-memory ring: the compiled extension", out), out
        # the wheel's extensions are compiled: info must not send the user after Cython
        assert "not needed: the extensions are compiled" in out, out
        assert "pydotcompute[cython]" not in out, out


def test_the_observability_extra_runs_the_observability_guide(
    installed: Installed, dists: Dists
) -> None:
    """Every block of the docs that needs the extra runs with the extra and nothing else."""
    blocks = _observability_blocks()
    assert len(blocks) >= 3, [b.id for b in blocks]
    _pip(installed.python, f"{dists.wheel}[observability]")
    for block in blocks:
        _python_in(installed, block.code)


# --- the fallbacks of setup_cython.py ----------------------------------------------------


def test_the_sdist_builds_without_cython_or_a_compiler(
    dists: Dists, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """No Cython (the build is not isolated, so only what this environment has counts) and
    a C compiler that always fails (``CC=false``): the wheel builds, with a warning per
    extension, and the installed package runs on its pure-Python twins."""
    home = tmp_path_factory.mktemp("nocompiler")
    python = _venv(home / "venv")
    _pip(python, "setuptools>=77")
    no_cython = "import importlib.util as u; assert u.find_spec('Cython') is None, 'Cython'"
    _run([str(python), "-c", no_cython], cwd=home)
    out = home / "out"
    log = _run(
        [
            str(python),
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "-v",
            "-w",
            str(out),
            str(dists.sdist),
        ],
        cwd=home,
        env=_env(CC="false"),
        stderr=True,
    )
    for ext in EXTENSIONS:  # the shipped C source went to the "compiler", which failed
        failed = rf"building a Cython extension failed \(.*'false'.*{ext}\.c.*pure-Python twins"
        assert re.search(failed, log), f"no warning for {ext}:\n{log[-4000:]}"
    (wheel,) = out.glob(f"pydotcompute-{VERSION}-*.whl")
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".so")]
    _pip(python, str(wheel))
    ran = _run(
        [
            str(python),
            "-c",
            _readme_quick_start() + "\nimport pydotcompute.ring_kernels._native"
            " as n\nprint(n.IMPLEMENTATION, n.queue_extension())\n",
        ],
        cwd=home,
    )
    assert ran.strip().splitlines()[-2:] == ["6.0", "python None"], ran
    info = _run([str(python), "-m", "pydotcompute", "info"], cwd=home)
    assert re.search(r"process\s+yes\s+shared-memory ring: the pure-Python twin", info), info


def _setup_cython() -> Any:
    pytest.importorskip("setuptools", reason="setup_cython.py imports setuptools")
    spec = importlib.util.spec_from_file_location(
        "setup_cython_under_test", ROOT / "setup_cython.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def without_cython(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Cython not importable, the working directory an empty source tree."""
    monkeypatch.setitem(sys.modules, "Cython", None)
    monkeypatch.setitem(sys.modules, "Cython.Build", None)
    monkeypatch.delenv("PYDOTCOMPUTE_REQUIRE_CYTHON", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / NATIVE).mkdir(parents=True)
    return tmp_path


def test_without_cython_the_shipped_c_sources_are_compiled(without_cython: Path) -> None:
    for ext in EXTENSIONS:
        (without_cython / NATIVE / f"{ext}.c").write_text("/* generated */\n")
    exts = _setup_cython()._extensions()
    assert [(e.name.rsplit(".", 1)[1], e.sources) for e in exts] == [
        (ext, [f"{NATIVE}/{ext}.c"]) for ext in EXTENSIONS
    ]


def test_without_cython_or_c_sources_the_build_goes_on_without_extensions(
    without_cython: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _setup_cython()
    assert module._extensions() == []
    assert "Cython is not installed; using the pure-Python fallbacks" in capsys.readouterr().out
    monkeypatch.setenv("PYDOTCOMPUTE_REQUIRE_CYTHON", "1")  # CI's extension job: fail loudly
    with pytest.raises(ImportError):
        module._extensions()


def test_a_failed_compile_warns_unless_the_extension_is_required(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext

    module = _setup_cython()

    def no_compiler(self: Any, ext: Any) -> None:
        raise RuntimeError("command 'gcc' failed: No such file or directory")

    monkeypatch.setattr(build_ext, "build_extension", no_compiler)
    monkeypatch.delenv("PYDOTCOMPUTE_REQUIRE_CYTHON", raising=False)
    cmd = module.OptionalBuildExt(Distribution())
    cmd.build_extension(object())
    err = capsys.readouterr().err
    assert "building a Cython extension failed (command 'gcc' failed" in err
    assert "pure-Python twins" in err
    monkeypatch.setenv("PYDOTCOMPUTE_REQUIRE_CYTHON", "1")
    with pytest.raises(RuntimeError, match="command 'gcc' failed"):
        cmd.build_extension(object())


# --- the extras match what the docs import -----------------------------------------------


def _observability_blocks() -> list[Block]:
    return [b for path in doc_files() for b in extract(path) if "observability" in b.requires]


def _imported_modules(code: str) -> set[str]:
    """Every module ``code`` imports, with ``from a import b`` giving ``a.b`` too when that
    is a module (``from opentelemetry import trace``: the api's ``opentelemetry.trace``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                try:
                    if importlib.util.find_spec(name) is not None:
                        found.add(name)
                except (ImportError, ValueError):
                    pass
    return found


def _third_party(module: str) -> bool:
    top = module.split(".")[0]
    return top not in sys.stdlib_module_names and top != "pydotcompute"


def _distribution_of(module: str) -> str | None:
    """The installed distribution whose files hold ``module`` (None for a namespace
    package such as ``opentelemetry``, which several distributions share)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None, f"{module} is not installed here: make install (the dev extra)"
    if spec.origin is None or spec.origin == "namespace":
        return None
    origin = Path(spec.origin).resolve()
    top = module.split(".")[0]
    for name in importlib.metadata.packages_distributions().get(top, []):
        dist = importlib.metadata.distribution(name)
        if any(Path(str(dist.locate_file(f))).resolve() == origin for f in dist.files or ()):
            return re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()
    raise AssertionError(f"no installed distribution holds {module} ({origin})")


def _extra(name: str) -> set[str]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    reqs = project["optional-dependencies"][name]
    names = {re.split(r"[^A-Za-z0-9._-]", r, maxsplit=1)[0] for r in reqs}  # "a[b]>=1" -> a
    return {re.sub(r"[-_.]+", "-", n).lower() for n in names}


def test_the_observability_extra_covers_what_its_examples_import() -> None:
    """pyproject's ``observability`` extra names the distribution of every third-party
    module imported by the docs' blocks marked ``requires: observability`` and by
    examples/traced_pipeline.py (``opentelemetry.sdk`` is ``opentelemetry-sdk``, not the
    api)."""
    sources = [b.code for b in _observability_blocks()]
    sources.append((ROOT / "examples" / "traced_pipeline.py").read_text(encoding="utf-8"))
    modules = {m for code in sources for m in _imported_modules(code) if _third_party(m)}
    assert {"prometheus_client", "opentelemetry.sdk.trace"} <= modules, modules
    needed = {d for m in modules if (d := _distribution_of(m)) is not None}
    assert {"prometheus-client", "opentelemetry-api", "opentelemetry-sdk"} <= needed, needed
    missing = needed - _extra("observability")
    assert not missing, (
        f"the observability extra lacks {sorted(missing)}, which the docs' observability "
        "examples import: add them to [project.optional-dependencies] observability"
    )
