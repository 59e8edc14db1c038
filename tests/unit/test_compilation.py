"""KernelCompiler and KernelCache: compile once per key, PTX persisted on disk across processes,
and every shipped CUDA kernel compile-checked to PTX without a GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pydotcompute.backends._cuda_kernels import VECTOR_ADD_CU, VECTOR_ADD_CU_NAME
from pydotcompute.backends.cuda import cuda_simulator_enabled
from pydotcompute.compilation import (
    CompilationOptions,
    CompiledKernel,
    KernelCache,
    KernelCompiler,
    check_ptx,
    compile_kernel,
    cuda_ptx_check,
    get_compiler,
    get_kernel_cache,
)
from pydotcompute.compilation.compiler import source_hash
from pydotcompute.compilation.ptx_check import ShippedKernel, shipped_kernels
from pydotcompute.exceptions import (
    BackendNotAvailableError,
    InvalidConfigurationError,
    KernelCompilationError,
)

HAS_NVRTC = importlib.util.find_spec("cupy") is not None
HAS_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None or (
    importlib.util.find_spec("numba") is not None
)
needs_nvrtc = pytest.mark.skipif(not HAS_NVRTC, reason="CuPy (NVRTC) is not installed")
needs_ptx = pytest.mark.skipif(
    not HAS_NUMBA_CUDA or cuda_simulator_enabled(),
    reason="needs numba-cuda and a process without the CUDA simulator",
)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path: Path) -> KernelCache:
    return KernelCache(tmp_path / "kc", max_entries=8, max_size_mb=1)


@pytest.fixture
def compiler(cache: KernelCache) -> KernelCompiler:
    return KernelCompiler(cache=cache)


# --- KernelCache ------------------------------------------------------------------------------


def test_cache_round_trip(cache: KernelCache) -> None:
    assert cache.load("abc") is None
    assert not cache.contains("abc")
    path = cache.store("abc", "ptx text", kind="ptx", metadata={"name": "k"})
    assert path.read_bytes() == b"ptx text"
    assert "abc" in cache
    assert cache.load_text("abc") == "ptx text"
    assert cache.metadata("abc")["metadata"] == {"name": "k"}  # type: ignore[index]
    s = cache.get_stats()
    assert (s.entries, s.hits, s.misses, s.stores, s.size_bytes) == (1, 1, 1, 1, 8)
    assert s.hit_rate == 0.5
    [entry] = cache.entries()
    assert (entry.key, entry.kind, entry.size_bytes) == ("abc", "ptx", 8)
    assert cache.remove("abc")
    assert not cache.remove("abc")
    assert cache.load("abc") is None


def test_cache_binary_and_clear(cache: KernelCache) -> None:
    cache.store("a", b"\x00\x01", kind="cubin")
    cache.store("b", b"\x02")
    assert cache.clear() == 2
    assert cache.entries() == []
    assert not any(p.name.startswith(".tmp-") for p in cache.cache_dir.iterdir())


def test_cache_lru_eviction_by_count(cache: KernelCache) -> None:
    for i in range(8):
        cache.store(f"k{i}", b"x")
        os.utime(cache.cache_dir / f"k{i}.bin", (1000 + i, 1000 + i))
    cache.load("k0")  # k0 becomes the most recently used
    cache.store("k8", b"x")
    keys = {e.key for e in cache.entries()}
    assert len(keys) == 8
    assert "k0" in keys
    assert "k1" not in keys  # the least recently used went
    assert cache.get_stats().evictions == 1


def test_cache_eviction_by_size(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path, max_entries=100, max_size_mb=1)
    half = b"x" * (600 * 1024)
    cache.store("one", half)
    os.utime(tmp_path / "one.bin", (1000, 1000))
    cache.store("two", half)
    assert [e.key for e in cache.entries()] == ["two"]
    cache.store("big", b"x" * (2 * 2**20))  # larger than the limit on its own: kept, others go
    assert [e.key for e in cache.entries()] == ["big"]


def test_cache_rejects_bad_keys_and_limits(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    with pytest.raises(
        InvalidConfigurationError, match=r"cache keys are 1-128 characters.*'\.\./x'"
    ):
        cache.store("../x", b"")
    with pytest.raises(InvalidConfigurationError, match="max_entries must be an int >= 1"):
        KernelCache(tmp_path, max_entries=0)
    with pytest.raises(InvalidConfigurationError, match="max_size_mb must be > 0"):
        KernelCache(tmp_path, max_size_mb=0)


def test_default_cache_dir_honours_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PYDOTCOMPUTE_CACHE_DIR", str(tmp_path / "here"))
    assert KernelCache().cache_dir == tmp_path / "here"
    monkeypatch.delenv("PYDOTCOMPUTE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert KernelCache().cache_dir == tmp_path / "xdg" / "pydotcompute" / "kernels"
    assert get_kernel_cache() is get_kernel_cache()


# --- a cache directory only this user can write; entries checked against their record ------

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
posix_only = pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX owners and modes")


def _planted(tmp_path: Path, mode: int, owner: int | None = None) -> Path:
    """A directory holding a complete, well-formed entry `k` with planted contents, then
    given `mode` (and `owner`): what another user could have left there."""
    where = tmp_path / "shared"
    KernelCache(where).store("k", "planted ptx", kind="ptx", metadata={"name": "k"})
    os.chmod(where, mode)
    if owner is not None:
        os.chown(where, owner, owner)
    return where


@posix_only
@pytest.mark.parametrize(
    ("mode", "owner", "why"),
    [
        (0o777, None, r"can be written by its group or by others \(mode 0o777\)"),
        (0o775, None, r"can be written by its group or by others \(mode 0o775\)"),
        (0o757, None, r"can be written by its group or by others \(mode 0o757\)"),
        pytest.param(
            0o700,
            65534,
            r"is owned by uid 65534, not by this user",
            marks=pytest.mark.skipif(not IS_ROOT, reason="chown to another user needs root"),
        ),
    ],
    ids=["world", "group", "others", "other-owner"],
)
def test_a_cache_directory_others_can_write_is_not_trusted(
    tmp_path: Path, mode: int, owner: int | None, why: str
) -> None:
    shared = _planted(tmp_path, mode, owner)
    cache = KernelCache(shared)
    with pytest.warns(RuntimeWarning, match=rf"kernel cache directory .*shared.*{why}") as record:
        planted = cache.load("k")
    assert planted is None  # the planted entry is never read
    assert len(record) == 1
    assert "PYDOTCOMPUTE_CACHE_DIR" in str(record[0].message)  # how to fix it
    private = cache.cache_dir
    assert private != shared
    st = private.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o700)
    assert not cache.contains("k")
    assert cache.entries() == []
    cache.store("k", "our ptx")  # stores go to the private directory
    assert cache.load_text("k") == "our ptx"
    assert (shared / "k.bin").read_text() == "planted ptx"  # the shared one is left alone


@posix_only
def test_the_cache_directory_is_made_private(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path / "made" / "kernels")
    cache.store("k", "ptx")
    st = (tmp_path / "made" / "kernels").stat()
    assert (st.st_uid, st.st_mode & 0o077) == (os.geteuid(), 0)
    assert cache.cache_dir == tmp_path / "made" / "kernels"


def test_an_entry_that_does_not_match_its_record_is_not_used(cache: KernelCache) -> None:
    cache.store("k", "real ptx", metadata={"source_key": "abc"})
    assert cache.load_text("k") == "real ptx"
    assert cache.load("k", expect={"source_key": "abc"}) == b"real ptx"
    assert cache.load("k", expect={"source_key": "other"}) is None  # built from another source
    (cache.cache_dir / "k.bin").write_text("planted ptx")  # contents its record does not hash to
    assert cache.load("k") is None
    cache.store("j", "real ptx")
    (cache.cache_dir / "j.json").unlink()  # no record at all
    assert cache.load("j") is None
    cache.store("i", "real ptx")
    os.replace(cache.cache_dir / "i.json", cache.cache_dir / "h.json")  # another key's record
    os.replace(cache.cache_dir / "i.bin", cache.cache_dir / "h.bin")
    assert cache.load("h") is None
    assert cache.get_stats().hits == 2


# --- source hashing ----------------------------------------------------------------------------


def test_source_hash_sees_closures_and_source() -> None:
    def make(k: int) -> Callable[[int], int]:
        def f(x: int) -> int:
            return x * k

        return f

    assert source_hash(make(2)) == source_hash(make(2))
    assert source_hash(make(2)) != source_hash(make(3))
    assert source_hash("a") != source_hash("b")
    assert source_hash(len)  # builtins hash by identity


# --- KernelCompiler: CPU ------------------------------------------------------------------------


def add_one(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.shape[0]):
        out[i] = x[i] + 1


def test_compiles_once_per_key(compiler: KernelCompiler) -> None:
    k1 = compiler.compile(add_one, device="cpu")
    k2 = compiler.compile(add_one, device="cpu")
    k3 = compiler.compile(add_one, device="cpu", signature="void(float64[:], float64[:])")
    k4 = compiler.compile(add_one, device="cpu", fastmath=False)
    assert k1 is k2
    assert len({id(k1), id(k3), id(k4)}) == 3
    s = compiler.get_stats()
    assert (s.hits, s.misses, s.compilations, s.entries) == (1, 3, 3, 3)
    out = np.empty(3)
    k3(np.arange(3.0), out)
    np.testing.assert_array_equal(out, [1, 2, 3])
    assert k1.device == "cpu"
    assert k1.py_func is add_one
    assert "add_one" in repr(k1)
    info = compiler.get_cache_stats()
    assert (info["hits"], info["size"]) == (1, 3)
    compiler.clear()
    assert compiler.get_stats().entries == 0


def test_compile_option_and_device_validation(compiler: KernelCompiler) -> None:
    with pytest.raises(InvalidConfigurationError, match=r"unknown compile option.*turbo"):
        compiler.compile(add_one, device="cpu", turbo=True)
    with pytest.raises(
        InvalidConfigurationError, match="device must be one of auto, cpu, cuda, metal"
    ):
        compiler.compile(add_one, device="tpu")
    with pytest.raises(KernelCompilationError, match="source strings are CUDA C"):
        compiler.compile("int x;", device="cpu")
    with pytest.raises(
        KernelCompilationError, match="must be a Python function or CUDA C source, got int"
    ):
        compiler.compile(42, device="cpu")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigurationError, match="needs name="):
        compiler.compile(VECTOR_ADD_CU, device="cuda")


def test_options_are_part_of_the_key() -> None:
    a = CompilationOptions(fastmath=True).cache_key()
    b = CompilationOptions(fastmath=False).cache_key()
    assert a != b
    assert CompilationOptions(name="x").cache_key() == CompilationOptions(name="y").cache_key()


def test_auto_device_and_module_helpers() -> None:
    k = compile_kernel(add_one)
    assert k.device in ("cpu", "cuda", "metal")
    assert get_compiler() is get_compiler()


@pytest.mark.skipif(importlib.util.find_spec("mlx") is None, reason="MLX is not installed")
def test_metal_compile(compiler: KernelCompiler) -> None:
    import mlx.core as mx

    k = compiler.compile(lambda x: x * 2 + 1, device="metal")
    assert np.array(k(mx.array([1.0, 2.0]))).tolist() == [3.0, 5.0]
    with pytest.raises(KernelCompilationError, match="compile only for device='cuda'"):
        compiler.compile("src", device="metal")


# --- KernelCompiler: CUDA without a GPU ------------------------------------------------------


@needs_nvrtc
def test_cuda_c_compiles_to_ptx_and_persists(compiler: KernelCompiler, cache: KernelCache) -> None:
    k = compiler.compile(VECTOR_ADD_CU, name=VECTOR_ADD_CU_NAME, device="cuda", cc=(8, 0))
    assert k.ptx is not None
    assert f".entry {VECTOR_ADD_CU_NAME}" in k.ptx
    assert ".target sm_80" in k.ptx
    assert not k.from_disk_cache
    assert compiler.get_stats().nvrtc_compilations == 1
    assert cache.get_stats().entries == 1
    [entry] = cache.entries()
    assert entry.metadata["tool"] == "nvrtc"
    # a second compiler (a fresh process, as far as memory goes) reads the PTX from disk
    other = KernelCompiler(cache=cache)
    k2 = other.compile(VECTOR_ADD_CU, name=VECTOR_ADD_CU_NAME, device="cuda", cc=(8, 0))
    assert k2.from_disk_cache
    assert k2.ptx == k.ptx
    s = other.get_stats()
    assert (s.disk_hits, s.nvrtc_compilations, s.compilations) == (1, 0, 0)
    # another target is another entry
    other.compile(VECTOR_ADD_CU, name=VECTOR_ADD_CU_NAME, device="cuda", cc=(9, 0))
    assert cache.get_stats().entries == 2


@needs_nvrtc
def test_cuda_c_ptx_from_disk_is_checked_before_use(tmp_path: Path) -> None:
    def compile_in(where: Path) -> CompiledKernel:
        return KernelCompiler(cache=KernelCache(where)).compile(
            VECTOR_ADD_CU, name=VECTOR_ADD_CU_NAME, device="cuda", cc=(8, 0)
        )

    own = tmp_path / "own"
    real = compile_in(own)
    [entry] = KernelCache(own).entries()
    planted = f"// planted\n.entry {VECTOR_ADD_CU_NAME}\n"
    (own / f"{entry.key}.bin").write_text(planted)  # contents its record does not match
    again = compile_in(own)
    assert not again.from_disk_cache
    assert again.ptx == real.ptx
    assert compile_in(own).from_disk_cache  # rewritten: a good entry is used again
    # a whole entry filed under the key of another target: its record says what it was built for
    sm90 = KernelCompiler(cache=KernelCache(own)).compile(
        VECTOR_ADD_CU, name=VECTOR_ADD_CU_NAME, device="cuda", cc=(9, 0)
    )
    other = next(e.key for e in KernelCache(own).entries() if e.key != entry.key)
    record = json.loads((own / f"{entry.key}.json").read_text())
    record["key"] = other
    (own / f"{other}.json").write_text(json.dumps(record))
    (own / f"{other}.bin").write_bytes((own / f"{entry.key}.bin").read_bytes())
    moved = KernelCompiler(cache=KernelCache(own)).compile(
        VECTOR_ADD_CU, name=VECTOR_ADD_CU_NAME, device="cuda", cc=(9, 0)
    )
    assert not moved.from_disk_cache
    assert moved.ptx == sm90.ptx
    assert moved.ptx is not None
    assert ".target sm_90" in moved.ptx
    # a directory another user could write: a complete entry in it is not used either
    KernelCache(own).store(entry.key, planted, kind="ptx", metadata=entry.metadata)
    os.chmod(own, 0o777)
    with pytest.warns(RuntimeWarning, match="kernel cache directory"):
        hostile = compile_in(own)
    assert not hostile.from_disk_cache
    assert hostile.ptx == real.ptx


@needs_nvrtc
def test_cuda_c_errors_carry_the_nvrtc_log(compiler: KernelCompiler) -> None:
    bad = 'extern "C" __global__ void broken(float* x) { x[0] = missing_symbol; }'
    with pytest.raises(
        KernelCompilationError, match=r"(?s)NVRTC failed.*'broken'.*missing_symbol.*undefined"
    ):
        compiler.compile(bad, name="broken", device="cuda")
    assert compiler.get_stats().errors == 1


@needs_nvrtc
def test_disk_cache_is_shared_across_processes(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(REPO)!r})
        from pydotcompute.compilation import KernelCache, KernelCompiler
        from pydotcompute.backends._cuda_kernels import VECTOR_ADD_CU, VECTOR_ADD_CU_NAME
        c = KernelCompiler(cache=KernelCache({str(tmp_path)!r}))
        k = c.compile(VECTOR_ADD_CU, name=VECTOR_ADD_CU_NAME, device="cuda", cc=(8, 0))
        s = c.get_stats()
        print(json.dumps([k.from_disk_cache, s.nvrtc_compilations, len(k.ptx)]))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}

    def run() -> list[Any]:
        out = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    first, second = run(), run()
    assert first[:2] == [False, 1]
    assert second[:2] == [True, 0]
    assert first[2] == second[2]


@needs_ptx
def test_python_cuda_kernel_with_signature_gets_ptx_without_gpu(
    compiler: KernelCompiler, cache: KernelCache
) -> None:
    from pydotcompute.backends._cuda_kernel_defs import vector_add

    sig = "void(float32[::1], float32[::1], float32[::1])"
    k = compiler.compile(vector_add, signature=sig, device="cuda", cc=(8, 0))
    assert k.ptx is not None
    assert ".entry" in k.ptx
    assert compiler.get_stats().ptx_compilations == 1
    again = KernelCompiler(cache=cache).compile(vector_add, signature=sig, device="cuda", cc=(8, 0))
    assert again.from_disk_cache
    lazy = compiler.compile(vector_add, device="cuda")
    assert lazy.ptx is None  # no signature: compiled per argument types at launch


@needs_ptx
def test_python_cuda_kernel_error_is_reported(compiler: KernelCompiler) -> None:
    def broken(x: Any) -> None:
        x[0] = not_defined_anywhere  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(KernelCompilationError, match=r"(?s)'broken'.*not_defined_anywhere"):
        compiler.compile(broken, signature="void(float32[:])", device="cuda", cc=(8, 0))


# --- the PTX check of every shipped kernel ---------------------------------------------------


def test_shipped_kernels_are_listed() -> None:
    names = {k.name for k in shipped_kernels()}
    assert {
        "backends.cuda.vector_add",
        "backends.cuda.matmul_f32",
        "backends.cuda.vector_add_cu",
    } <= names
    assert shipped_kernels(["no.such.module"]) == []


@needs_ptx
@needs_nvrtc
def test_every_shipped_cuda_kernel_compiles_to_ptx() -> None:
    results = cuda_ptx_check(cc=(8, 0))
    assert results
    assert all(r.ok and r.ptx_bytes > 0 for r in results)
    kinds = {r.signature is None for r in results}
    assert kinds == {True, False}  # both NVRTC (no signature) and Numba kernels were checked


@needs_ptx
@needs_nvrtc
def test_ptx_check_reports_failures() -> None:
    bad = [
        ShippedKernel("bad.cu", "cuda-c", lambda: "this is not C", entry="nope"),
        ShippedKernel(
            "bad.py", "numba", lambda: lambda x: x.nope(), signatures=("void(int32[:])",)
        ),
    ]
    results = check_ptx((8, 0), bad)
    assert [r.ok for r in results] == [False, False]
    assert "NVRTC failed" in (results[0].error or "")


def test_ptx_check_inside_simulator_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydotcompute.compilation import compiler as compiler_mod

    # turn the simulator on where the probe reads it: numba.config once Numba is imported,
    # the environment before
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    numba = sys.modules.get("numba")
    if numba is not None and hasattr(numba, "config"):
        monkeypatch.setattr(numba.config, "ENABLE_CUDASIM", 1)
    assert cuda_simulator_enabled()
    with pytest.raises(
        BackendNotAvailableError, match="PTX cannot be produced while the Numba CUDA simulator"
    ):
        compiler_mod.numba_compile_ptx(add_one, "void(float64[:], float64[:])", (8, 0))


# --- the shapes code written for 0.2 calls ---------------------------------------------


def test_compilation_options_0_2_shape() -> None:
    opts = CompilationOptions(
        device="cuda", fastmath=True, debug=False, lineinfo=False, opt_level=3, cache=True
    )
    assert (opts.device, opts.fastmath, opts.opt_level, opts.cache) == ("cuda", True, 3, True)
    positional = CompilationOptions("cpu", False, True, True, 1, False)
    assert (positional.device, positional.fastmath, positional.debug) == ("cpu", False, True)
    assert (positional.lineinfo, positional.opt_level, positional.cache) == (True, 1, False)
    assert CompilationOptions() == opts  # 0.2's defaults
    assert CompilationOptions(opt_level=0).cache_key() != opts.cache_key()
    with pytest.raises(InvalidConfigurationError, match="opt_level must be 0, 1, 2 or 3, got 7"):
        CompilationOptions(opt_level=7)
    with pytest.raises(InvalidConfigurationError, match=r"device must be one of .* got 'tpu'"):
        CompilationOptions(device="tpu")


def test_options_given_to_the_compiler_choose_its_device(cache: KernelCache) -> None:
    compiler = KernelCompiler(CompilationOptions(device="cpu", fastmath=False), cache=cache)
    k = compiler.compile(add_one)
    assert k.device == "cpu"
    a = np.zeros(3)
    out = np.empty(3)
    k(a, out)
    assert out.tolist() == [1.0, 1.0, 1.0]
    assert "device=cpu" in repr(compiler)


def test_compiled_kernel_built_the_0_2_way() -> None:
    def double(x: float) -> float:
        return 2 * x

    opts = CompilationOptions(device="cpu")
    k = CompiledKernel(double, "double", "abc123", None, opts, compile_time_ms=1.5, ptx=None)
    assert k(4) == 8  # calls the kernel it wraps
    assert (k.kernel, k.name, k.source_hash, k.signature) == (double, "double", "abc123", None)
    assert (k.options, k.compile_time_ms, k.ptx, k.device) == (opts, 1.5, None, "cpu")
    assert k.py_func is double
    positional = CompiledKernel(double, "d", "h", "f8(f8)", opts, 0.0, ".ptx")
    assert (positional.signature, positional.ptx) == ("f8(f8)", ".ptx")
    with pytest.raises(InvalidConfigurationError, match="needs the compiled kernel"):
        CompiledKernel()


def test_kernel_compiler_0_2_methods(compiler: KernelCompiler) -> None:
    assert isinstance(compiler.cuda_available, bool)
    assert compiler.numba_available == (importlib.util.find_spec("numba") is not None)
    k = compiler.compile(add_one, device="cpu")
    assert k.source_hash == source_hash(add_one)
    assert compiler.get_cached_kernel(k.source_hash) is k
    assert compiler.get_cached_kernel(k.key) is k
    assert compiler.get_cached_kernel("no-such-hash") is None
    stats = compiler.get_cache_stats()
    assert (stats["misses"], stats["size"]) == (1, 1)
    assert compiler.clear_cache() == 1
    assert compiler.get_cached_kernel(k.source_hash) is None
    assert compiler.clear_cache() == 0
    assert repr(compiler).startswith(f"KernelCompiler(cuda={compiler.cuda_available}, ")


def test_compile_kernel_takes_options_as_keywords() -> None:
    k = compile_kernel(add_one, signature=None, device="cpu", fastmath=False, opt_level=2)
    assert (k.options.fastmath, k.options.opt_level) == (False, 2)
    with pytest.raises(InvalidConfigurationError, match=r"unknown compile option.*bogus"):
        compile_kernel(add_one, device="cpu", bogus=1)


def test_kernel_cache_0_2_shape(tmp_path: Path) -> None:
    cache = KernelCache(cache_dir=tmp_path / "c", max_entries=128, max_size_mb=256)
    assert cache.load("vector_add", "h1") is None
    assert not cache.contains("vector_add", "h1")
    assert cache.store("vector_add", "h1", b".ptx one", signature="void(f4[:])") is True
    assert cache.store("vector_add", "h2", ".ptx two", metadata={"arch": "sm_80"}) is True
    assert cache.load("vector_add", "h1") == b".ptx one"
    assert cache.load("vector_add", "h2") == b".ptx two"  # a text PTX comes back as bytes
    assert cache.contains("vector_add", "h1")
    entries = {e.source_hash: e for e in cache.entries()}
    assert set(entries) == {"h1", "h2"}
    assert entries["h1"].kernel_name == "vector_add"
    assert entries["h2"].metadata == {"arch": "sm_80"}
    assert cache.metadata(cache.entry_key("vector_add", "h1"))["signature"] == "void(f4[:])"  # type: ignore[index]
    assert cache.get_stats().entries == 2
    assert cache.remove("vector_add", "h1") is True
    assert cache.remove("vector_add", "h1") is False
    assert cache.clear() == 1
    # keyword form, and names that are not valid keys on their own
    assert cache.store(kernel_name="my kernel/v2", source_hash="x", ptx=b"p") is True
    assert cache.load("my kernel/v2", "x") == b"p"
    assert cache.load(kernel_name="my kernel/v2", source_hash="x") == b"p"
    assert cache.contains(kernel_name="my kernel/v2", source_hash="x")
    assert cache.remove(kernel_name="my kernel/v2", source_hash="x") is True
    assert not cache.contains("my kernel/v2", "x")


def test_kernel_cache_0_2_store_returns_false_when_it_cannot_write(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = KernelCache(cache_dir=blocker / "sub")
    assert cache.store("k", "h", b"ptx") is False
    with pytest.raises(OSError):
        cache.store("k", b"ptx")  # the two-argument form raises


def test_warmup_kernels_compiles_ahead(compiler: KernelCompiler) -> None:
    from pydotcompute.compilation import warmup_kernels

    def scale(x: np.ndarray, out: np.ndarray) -> None:
        for i in range(x.shape[0]):
            out[i] = x[i] * 3.0

    compiled = warmup_kernels([add_one, (scale, "void(float64[:], float64[:])")], device="cpu")
    assert set(compiled) == {"add_one", "scale"}
    assert compiled["scale"].signature == "void(float64[:], float64[:])"
    again = warmup_kernels([add_one], device="cpu")
    assert again["add_one"] is compiled["add_one"]  # cached: compiled once
    out = np.empty(2)
    compiled["scale"](np.ones(2), out)
    assert out.tolist() == [3.0, 3.0]


# --- the cache reads only the directory it checked ----------------------------------------


@posix_only
def test_a_directory_swapped_in_after_the_check_is_not_read(tmp_path: Path) -> None:
    """Ours renamed away and another put in its place (private, with a well-formed entry
    under the same key) after the cache checked it: the cache never reads the newcomer."""
    where = tmp_path / "kc"
    cache = KernelCache(where)
    cache.store("k", "our ptx")
    assert cache.load_text("k") == "our ptx"
    os.rename(where, tmp_path / "moved")
    KernelCache(where).store("k", "their ptx")  # same name, same key, a valid record
    with pytest.warns(RuntimeWarning, match=r"kernel cache directory .*kc is no longer used"):
        got = cache.load("k")
    assert got is None  # a miss: neither theirs nor anything read through the new path
    assert cache.cache_dir not in (where, tmp_path / "moved")
    cache.store("k", "our ptx again")  # the cache goes on in a private directory
    assert cache.load_text("k") == "our ptx again"
    assert (where / "k.bin").read_text() == "their ptx"  # theirs is left alone


@posix_only
def test_a_directory_swapped_in_is_caught_by_its_identity(tmp_path: Path) -> None:
    """The check is the directory's identity (device and inode), not its name or its
    owner and mode, which the newcomer can match."""
    where = tmp_path / "kc"
    cache = KernelCache(where)
    cache.store("k", "our ptx")
    os.rename(where, tmp_path / "moved")
    os.mkdir(where, 0o700)
    os.rename(tmp_path / "moved" / "k.bin", where / "k.bin")  # even our own files, moved
    os.rename(tmp_path / "moved" / "k.json", where / "k.json")
    with pytest.warns(RuntimeWarning, match=r"now leads to another directory \(device "):
        assert cache.load("k") is None


@posix_only
@pytest.mark.parametrize("suffix", [".bin", ".json"])
@pytest.mark.parametrize("mode", [0o666, 0o620, 0o602])
def test_an_entry_file_others_can_write_is_not_used(
    cache: KernelCache, suffix: str, mode: int
) -> None:
    cache.store("k", "ptx")
    os.chmod(cache.cache_dir / f"k{suffix}", mode)
    why = rf"can be written by its group or by others \(mode {oct(mode)}\)"
    with pytest.warns(
        RuntimeWarning, match=rf"kernel cache entry .*k\{suffix} is not used: .*{why}"
    ):
        assert cache.load("k") is None
    os.chmod(cache.cache_dir / f"k{suffix}", 0o600)
    assert cache.load_text("k") == "ptx"  # fixed: used again


@posix_only
@pytest.mark.skipif(not IS_ROOT, reason="chown to another user needs root")
def test_an_entry_file_of_another_user_is_not_used(cache: KernelCache) -> None:
    cache.store("k", "ptx")
    os.chown(cache.cache_dir / "k.bin", 65534, 65534)
    with pytest.warns(RuntimeWarning, match=r"k\.bin is not used: it is owned by uid 65534"):
        assert cache.load("k") is None


@posix_only
def test_an_entry_that_is_a_link_is_not_followed(cache: KernelCache, tmp_path: Path) -> None:
    cache.store("k", "ptx")
    elsewhere = tmp_path / "elsewhere.bin"
    os.replace(cache.cache_dir / "k.bin", elsewhere)
    os.symlink(elsewhere, cache.cache_dir / "k.bin")
    with pytest.warns(RuntimeWarning, match=r"k\.bin is not used: it is a symbolic link"):
        assert cache.load("k") is None


@posix_only
@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_cache_under_a_directory_others_can_write_is_not_trusted(
    tmp_path: Path, mode: int
) -> None:
    """As ssh's StrictModes: every ancestor must be root's or ours and not writable by
    others, unless sticky (as /tmp is): else another user could swap the cache away."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    where = shared / "me" / "kernels"
    cache = KernelCache(where)
    why = (
        rf"is inside {re.escape(str(shared))}, which can be written by its group or by others "
        rf"\(mode {oct(mode)}\) and is not sticky"
    )
    with pytest.warns(
        RuntimeWarning,
        match=rf"kernel cache directory {re.escape(str(where))} is not used: it {why}",
    ) as record:
        cache.store("k", "ptx")
    assert "PYDOTCOMPUTE_CACHE_DIR" in str(record[0].message)
    assert f"chmod go-w {shared}" in str(record[0].message)  # how to fix it
    assert cache.cache_dir != where
    assert cache.load_text("k") == "ptx"  # cached privately instead
    assert not (where / "k.bin").exists()


@posix_only
def test_a_cache_under_a_sticky_directory_is_trusted(tmp_path: Path) -> None:
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)  # as /tmp
    where = sticky / "kernels"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache = KernelCache(where)
        cache.store("k", "ptx")
        assert cache.load_text("k") == "ptx"
    assert cache.cache_dir == where


@posix_only
@pytest.mark.skipif(not IS_ROOT, reason="chown to another user needs root")
def test_a_cache_under_a_directory_of_another_user_is_not_trusted(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    os.chmod(theirs, 0o755)
    cache = KernelCache(theirs / "kernels")
    with pytest.warns(
        RuntimeWarning,
        match=rf"is inside {re.escape(str(theirs))}, which is owned by uid 65534, not by this user",
    ):
        cache.store("k", "ptx")
    assert cache.cache_dir != theirs / "kernels"


@posix_only
def test_the_directories_the_cache_makes_are_private(tmp_path: Path) -> None:
    """Missing parents are made private too (``mkdir -p`` would leave them to the umask,
    group-writable under a 002 umask, and the ancestor check would then refuse them)."""
    old = os.umask(0o002)
    try:
        cache = KernelCache(tmp_path / "a" / "b" / "kernels")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            cache.store("k", "ptx")
    finally:
        os.umask(old)
    for made in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "kernels"):
        assert made.stat().st_mode & 0o077 == 0, made
    assert cache.load_text("k") == "ptx"


@posix_only
def test_a_cache_directory_removed_by_hand_is_made_again(tmp_path: Path) -> None:
    """Nothing at the path is not a swap: it is checked and made afresh when next needed."""
    where = tmp_path / "kc"
    cache = KernelCache(where)
    cache.store("k", "ptx")
    shutil.rmtree(where)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.load("k") is None
        assert cache.entries() == []
        cache.store("k", "ptx again")
        assert cache.load_text("k") == "ptx again"
    assert cache.cache_dir == where
    assert (where / "k.bin").read_text() == "ptx again"
