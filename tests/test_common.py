"""The shared helpers in common/llmk_common, as every package sees them."""

import json

import pytest
import torch

llmk_common = pytest.importorskip("flashattn_triton._common", reason="flashattn-triton must be installed")
from flashattn_triton._common import (  # noqa: E402
    Backend,
    TuningTable,
    cdiv,
    check_same_device,
    check_tensor,
    num_sms,
    select_backend,
)


def test_check_tensor_names_the_argument():
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        check_tensor("q", [1, 2])
    with pytest.raises(TypeError, match=r"w must have dtype in \(float16, bfloat16\)"):
        check_tensor("w", torch.zeros(2, dtype=torch.float32), dtypes=(torch.float16, torch.bfloat16))
    with pytest.raises(ValueError, match="k must have rank 4"):
        check_tensor("k", torch.zeros(2, 3), rank=4)
    with pytest.raises(ValueError, match="x must have rank >= 2"):
        check_tensor("x", torch.zeros(3), min_rank=2)
    t = torch.ones(2, 2)
    assert check_tensor("t", t, dtypes=(torch.float32,), rank=2) is t


def test_cdiv_is_exact_ceiling():
    # Past 2**53 a float ceil would round; the planners see element counts that large.
    for a, b in [(0, 7), (1, 7), (7, 7), (8, 7), (2**62 + 1, 3), (14336, 64)]:
        assert cdiv(a, b) == (a + b - 1) // b


def test_check_same_device():
    a = torch.ones(1)
    assert check_same_device(a=a, b=None, c=torch.ones(2)) == torch.device("cpu")
    with pytest.raises(ValueError, match="no tensor"):
        check_same_device(a=None)
    meta = torch.ones(1, device="meta")
    with pytest.raises(ValueError, match="b is on meta but a is on cpu"):
        check_same_device(a=a, b=meta)


def test_num_sms(monkeypatch):
    from flashattn_triton._common import device as dev_mod

    assert num_sms(torch.device("cpu")) == 4 and num_sms(torch.device("cpu"), default=7) == 7
    props = type("P", (), {"multi_processor_count": 132})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    dev_mod._sm_count.cache_clear()
    try:
        assert num_sms(torch.device("cuda", 0)) == num_sms(0) == num_sms() == 132
    finally:
        dev_mod._sm_count.cache_clear()  # no faked count survives into other tests


def test_select_backend(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert select_backend(cpu) is Backend.INTERPRETER
    assert select_backend(cpu, has_interpreter=False) is Backend.TORCH
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert select_backend(cpu) is Backend.TORCH
    monkeypatch.delenv("TRITON_INTERPRET")
    assert select_backend(cpu) is Backend.TORCH
    assert select_backend(torch.device("cuda", 0)) is Backend.GPU
    with pytest.raises(ValueError, match="unsupported device"):
        select_backend(torch.device("meta"))


def test_tuning_table_lookup_and_arch_fallback(tmp_path):
    table = {
        "sm80": [{"match": {}, "config": {"BLOCK": 64}}],
        "sm86": [
            {"match": {"M": [1, 16]}, "config": {"BLOCK": 16}},
            {"match": {"dtype": "bf16"}, "config": {"BLOCK": 128}},
            {"match": {}, "config": {"BLOCK": 32}},
        ],
        "sm90": [{"match": {}, "config": {"BLOCK": 256}}],
        "cpu": [{"match": {}, "config": {"BLOCK": 8}}],
    }
    p = tmp_path / "t.json"
    p.write_text(json.dumps(table))
    t = TuningTable.from_json(p)
    assert t.lookup("sm86", M=8)["BLOCK"] == 16
    assert t.lookup("sm86", M=17, dtype="bf16")["BLOCK"] == 128
    assert t.lookup("sm86", M=17, dtype="fp16")["BLOCK"] == 32
    assert t.lookup("sm89", M=4)["BLOCK"] == 16  # nearest lower of the same major
    assert t.lookup("sm100", M=4)["BLOCK"] == 256  # nearest lower overall
    assert t.lookup("sm75")["BLOCK"] == 64  # older than any entry: the oldest table
    assert t.lookup("cpu")["BLOCK"] == 8
    # memoized per key, and every caller gets its own copy: mutating one never reaches the table
    got = t.lookup("sm86", M=17, dtype="bf16")
    got["BLOCK"] = -1
    assert t.lookup("sm86", dtype="bf16", M=17)["BLOCK"] == 128
    assert t.table["sm86"][1]["config"] == {"BLOCK": 128}
    with pytest.raises(KeyError):
        TuningTable({"sm90": [{"match": {"M": 1}, "config": {}}]}).lookup("sm90", M=2)


def test_every_package_ships_the_same_common_copy():
    import importlib

    mods = []
    for name in ("flashattn_triton", "int8_gemm", "fused_rmsnorm"):
        mods.append(importlib.import_module(f"{name}._common.tuning"))
    sources = {open(m.__file__).read() for m in mods}
    assert len(sources) == 1


def test_use_registered_op_only_when_tracing_or_fake():
    from flashattn_triton._common import use_registered_op

    assert not use_registered_op(torch.ones(2))
    assert use_registered_op(torch.ones(2, device="meta"))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.ones(2))
        assert use_registered_op(fake)
    seen = []

    @torch.compile(backend="eager", fullgraph=True)
    def f(x):
        seen.append(use_registered_op(x))
        return x + 1

    f(torch.ones(2))
    assert seen == [True]
