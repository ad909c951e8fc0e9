"""Explained misses (issue 18): entries keep their key's fields, misses are logged, and the JIT guard's
error and `kcache why-miss` name the field that differs from the nearest stored entry of the kernel,
one changed field at a time: pass_configs, out_idx, target arch, a toolchain field."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tilelang", reason="TileLang is a runtime dependency; install the project first")

import kcache  # noqa: E402
from kcache.cache import deployment, miss_explain  # noqa: E402
from kcache.cli import main as cli  # noqa: E402
from kcache.cli.contract import EXIT_NOT_FOUND  # noqa: E402
from kcache.tilelang import backend as tilelang_backend  # noqa: E402
from stress.programs.kernels import CPU_TARGET, elementwise_add  # noqa: E402

STORED = {"target": CPU_TARGET, "out_idx": [2]}
NEWER_NVCC = "Cuda compilation tools, release 13.0, V13.0.90 | Build cuda_13.0.r13.0/compiler.99999999_0"


@pytest.fixture(scope="module")
def stored_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root holding one compiled elementwise add (out_idx [2], no pass_configs, sm_90a)."""
    root = tmp_path_factory.mktemp("why-miss") / "root"
    settings = dataclasses.replace(kcache.Settings.from_env(root), compile_isolation="inprocess")
    kcache.KernelCache(root, settings=settings).get_or_compile(elementwise_add(), **STORED)
    return root


@pytest.fixture(autouse=True)
def _guard_off_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deployment, "_guard", None)
    monkeypatch.setattr(deployment, "_warned", set())


def why_miss(root: Path, *argv: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert cli.main(["--dir", str(root), "--json", "why-miss", *argv]) == 0
    return json.loads(capsys.readouterr().out)


CHANGES = {
    "pass_configs": ({"pass_configs": {"tl.disable_warp_specialized": True}},
                     "pass_configs[tl.disable_warp_specialized]", None, True),
    "out_idx": ({"out_idx": None}, "out_idx", [2], None),
    "target arch": ({"target": {"kind": "cuda", "arch": "sm_80"}}, "target[arch]", "sm_90a", "sm_80"),
    "toolchain": ({}, "toolchain[nvcc]", None, NEWER_NVCC),  # the fingerprint is changed below
}


@pytest.mark.tilelang
@pytest.mark.parametrize("change", list(CHANGES))
def test_the_guard_and_why_miss_name_the_one_changed_field(stored_root: Path, change: str,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    arguments, field, stored_value, your_value = CHANGES[change]
    if change == "toolchain":  # another nvcc on this machine: its fingerprint names another version
        real = tilelang_backend.toolchain_fingerprint
        monkeypatch.setattr(tilelang_backend, "toolchain_fingerprint",
                            lambda root, persist=True: {**real(root, persist), "nvcc": NEWER_NVCC})
    settings = dataclasses.replace(kcache.Settings.from_env(stored_root), compile_isolation="inprocess")
    cache = kcache.KernelCache(stored_root, settings=settings)
    kcache.guard("error")
    with pytest.raises(kcache.UnexpectedCompile) as refused:
        cache.get_or_compile(elementwise_add(), **{**STORED, **arguments})
    assert f"differs in 1 field: {field}: stored" in refused.value.why
    assert len(cache.store.keys()) == 1  # the guard refused before anything compiled
    if change == "toolchain":
        assert NEWER_NVCC in refused.value.why  # the changed fingerprint was the one keyed

    explained = why_miss(stored_root, refused.value.key[:12], capsys=capsys)
    assert explained["key"] == refused.value.key and explained["refused"] and not explained["stored"]
    assert [d["field"] for d in explained["differences"]] == [field]
    difference = explained["differences"][0]
    if stored_value is not None:
        assert difference["stored"] == stored_value
    if your_value is not None:
        assert difference["yours"] == your_value
    assert why_miss(stored_root, "--last", capsys=capsys)["key"] == refused.value.key


@pytest.mark.tilelang
def test_entries_keep_their_key_fields_and_misses_are_logged(stored_root: Path) -> None:
    (key,) = kcache.KernelCache(stored_root).store.keys()
    meta = json.loads((stored_root / "kernels" / key / "meta.json").read_text())
    fields = meta["key_fields"]
    assert fields["out_idx"] == [2] and fields["target"]["arch"] == "sm_90a" and len(fields["source_sha256"]) == 64
    assert "script" not in fields  # the source is kept as its digest, not its kilobytes
    compiled = [r for r in miss_explain.logged_misses(stored_root) if r["key"] == key]
    assert compiled and not compiled[0]["refused"] and compiled[0]["fields"] == fields


@pytest.mark.tilelang
def test_why_miss_of_a_key_stored_since_says_so(stored_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (key,) = kcache.KernelCache(stored_root).store.keys()
    explained = why_miss(stored_root, key[:10], capsys=capsys)  # its compile logged it as a miss
    assert explained["key"] == key and explained["stored"] and not explained["refused"]
    assert explained["nearest"] is None and explained["candidates"] == 0
    assert cli.main(["--dir", str(stored_root), "why-miss", key[:10]]) == 0
    shown = capsys.readouterr().out
    assert "stored in" in shown and "now: yes" in shown and "no other entry of kernel add_4096_256_float32" in shown


def test_why_miss_explains_a_recorded_key_against_an_entry_stored_before_key_fields(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A key from another machine's KCACHE_RECORD file, against an entry whose meta.json predates key
    fields: compared on what that meta.json has, and said so."""
    stored_key, missed_key = "a" * 64, "b" * 64
    toolchain = {"nvcc": "V13.0.88", "tilelang": "0.1.15"}
    entry = tmp_path / "root" / "kernels" / stored_key
    entry.mkdir(parents=True)
    (entry / "meta.json").write_text(json.dumps({"key": stored_key, "kernel": "main", "created": 1.0,
                                                 "target": {"arch": "sm_90a"}, "toolchain": toolchain}))
    fields = {"target": {"arch": "sm_90a"}, "toolchain": {**toolchain, "nvcc": "V13.0.90"}, "out_idx": None}
    keys_file = tmp_path / "keys.jsonl"
    keys_file.write_text(json.dumps({"key": missed_key, "kernel": "main", "fields": fields}) + "\n")
    explained = why_miss(tmp_path / "root", missed_key[:8], "--keys", str(keys_file), capsys=capsys)
    assert explained["nearest"] == stored_key and explained["partial"]
    assert explained["differences"] == [{"field": "toolchain[nvcc]", "stored": "V13.0.88", "yours": "V13.0.90",
                                         "stored_absent": False, "yours_absent": False}]


def test_why_miss_says_what_to_do_when_it_knows_no_such_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "root").mkdir()
    assert cli.main(["--dir", str(tmp_path / "root"), "why-miss", "abcdef12"]) == EXIT_NOT_FOUND
    error = capsys.readouterr().err
    assert "no key abcdef12 is logged as a miss" in error and "--keys" in error
    assert cli.main(["--dir", str(tmp_path / "root"), "why-miss", "--last"]) == EXIT_NOT_FOUND
    assert "no miss is logged" in capsys.readouterr().err


def test_an_isolated_compile_keeps_the_key_fields_the_caller_derived_its_key_from(tmp_path: Path) -> None:
    """The fields travel with the compile job: a worker's entry keeps the caller's, not its own."""
    from stress.programs import synthetic

    cache = kcache.KernelCache(tmp_path / "root", backend=synthetic)
    assert cache.settings.compile_isolation != "inprocess"
    cache.get_or_compile(synthetic.SyntheticFunc("k0"), "synthetic")
    (key,) = cache.store.keys()
    meta = json.loads((tmp_path / "root" / "kernels" / key / "meta.json").read_text())
    assert meta["key_fields"] == {"kind": "synthetic", "name": "k0", "toolchain": synthetic.toolchain_fingerprint(tmp_path)}


def test_a_key_prefix_that_matches_two_misses_asks_for_more_digits(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "root").mkdir()
    for key in ("abcd" + "0" * 60, "abcd" + "1" * 60):
        miss_explain.log_miss(tmp_path / "root", key, "main", {"out_idx": None})
    assert len(miss_explain.logged_misses(tmp_path / "root")) == 2  # both lines were written
    assert cli.main(["--dir", str(tmp_path / "root"), "why-miss", "abcd"]) == EXIT_NOT_FOUND
    assert "'abcd' matches 2 keys" in capsys.readouterr().err
    assert why_miss(tmp_path / "root", "abcd1", capsys=capsys)["key"] == "abcd" + "1" * 60
