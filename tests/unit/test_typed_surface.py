"""The package is typed for its users: ``py.typed`` ships, each compiled module has a stub
beside it that matches the extension, and a user's program type-checks against the public
names (lazily loaded ones included) with real types, not ``Any``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from foundation_helpers import ROOT

from pydotcompute.ring_kernels import _native

# mypy comes with the dev install (make install); the lighter installs of other Pythons
# (make test-versions) have none, and what these tests check does not vary by version
pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[dev]')")

NATIVE = ROOT / "pydotcompute" / "ring_kernels" / "_native"
COMPILED = sorted(p.stem for p in NATIVE.glob("*.pyx"))


def test_each_compiled_module_has_a_stub_beside_it() -> None:
    assert COMPILED == ["fast_message", "fast_queue_core", "fast_spsc", "fast_telemetry"]
    for name in COMPILED:
        stub = NATIVE / f"{name}.pyi"
        assert stub.is_file(), f"{name}.pyx has no {stub.name}"
        assert stub.read_text("utf-8").startswith('"""Type stubs of the compiled')


def test_the_wheel_ships_the_typing_marker_and_the_stubs() -> None:
    assert (ROOT / "pydotcompute" / "py.typed").is_file()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    data = config["tool"]["setuptools"]["package-data"]["pydotcompute"]
    assert "py.typed" in data
    assert "ring_kernels/_native/*.pyi" in data


def _mypy(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
        check=False,
    )


@pytest.mark.skipif(
    not _native.CYTHON_AVAILABLE,
    reason=f"the extension is not in use: {_native.extension_import_error()}",
)
def test_the_stubs_match_the_compiled_extensions() -> None:
    """``mypy.stubtest`` imports each extension and compares it with its stub (the
    allowlist says why each difference it lists is not an error in the stubs)."""
    modules = [f"pydotcompute.ring_kernels._native.{name}" for name in COMPILED]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy.stubtest",
            "--mypy-config-file",
            "pyproject.toml",
            "--allowlist",
            "tools/stubtest_allowlist.txt",
            *modules,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "unused allowlist entry" not in proc.stdout


USER_PROGRAM = """
    from __future__ import annotations

    from pydotcompute import KernelContext, RingKernelRuntime
    from pydotcompute.ring_kernels import CythonRingKernel, SyncQueue, ThreadedRingKernel
    from pydotcompute.ring_kernels._native import fast_spsc, fast_telemetry
    from pydotcompute.ring_kernels._native.fast_queue_core import QueueCore
    from pydotcompute.ring_kernels.extend import HostedKernel, TierWorker


    async def actor(ctx: KernelContext) -> None:
        await ctx.send(await ctx.receive())


    async def main() -> None:
        async with RingKernelRuntime() as rt:
            await rt.launch("p", actor)
            reveal_type(rt.kernel_ids)


    q = fast_spsc.FastSPSCQueue(8)
    reveal_type(q.put(1))
    reveal_type(fast_spsc.SharedByteRing.attach("r").try_read())
    reveal_type(fast_telemetry.LatencyRecorder().drain())
    reveal_type(QueueCore().qsize)
    reveal_type(ThreadedRingKernel("t", print).is_running)
    reveal_type(CythonRingKernel)
    reveal_type(SyncQueue[int](4).get(0.1))
    reveal_type(TierWorker.CAPABILITIES.actor_kind)
    reveal_type(HostedKernel.EXTRA_OPTIONS)
    q.put(item=1)
"""


def test_a_users_program_type_checks_against_the_public_names(tmp_path: Path) -> None:
    """Run as a user's project would (``--strict``, the package's own code not reported);
    the one error is the call the extension refuses at run time."""
    (tmp_path / "user.py").write_text(textwrap.dedent(USER_PROGRAM), "utf-8")
    (tmp_path / "mypy.ini").write_text(
        f"[mypy]\nstrict = True\nmypy_path = {ROOT}\n\n"
        "[mypy-pydotcompute.*]\nfollow_imports = silent\n",
        "utf-8",
    )
    proc = _mypy(
        "--config-file", "mypy.ini", "--cache-dir", str(tmp_path / "cache"), "user.py", cwd=tmp_path
    )
    revealed = [
        line.split('Revealed type is "', 1)[1].rstrip('"')
        for line in proc.stdout.splitlines()
        if "Revealed type is" in line
    ]
    assert revealed[:5] == [
        "list[str]",
        "bool",
        "bytes | None",
        "tuple[int, int, int, int, list[tuple[int, int]]] | None",
        "int",
    ], proc.stdout
    assert revealed[5] == "bool"  # a lazily loaded class, seen through TYPE_CHECKING
    assert revealed[6].endswith("-> pydotcompute.ring_kernels.tiers.process.kernel.ProcessKernel")
    assert revealed[7:] == [
        "int | None",
        "Literal['async'] | Literal['sync'] | None",
        "frozenset[str]",
    ]
    errors = [line for line in proc.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, proc.stdout
    assert 'Unexpected keyword argument "item" for "put" of "FastSPSCQueue"' in errors[0]
