"""Gaudi's autocast op lists (PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST / _FP32_OPS_LIST, what
optimum-habana's GaudiConfig writes) replace autocast's defaults inside torch.autocast("hpu").
Each case runs in its own process: the lists apply process-wide, once."""

from __future__ import annotations

import sys

from tests.integration.launch_helpers import run

_PROBE = r"""
import torch, hpu_runtime
a, b, c = torch.randn(4, 4, device="hpu"), torch.randn(4, 4, device="hpu"), torch.randn(4, device="hpu")
with torch.autocast("hpu", dtype=torch.bfloat16):
    out = {"mm": torch.mm(a, b), "addmm": torch.addmm(c, a, b), "linear": torch.nn.functional.linear(a, b),
           "softmax_of_bf16": torch.softmax(a.bfloat16(), -1), "bmm": torch.bmm(a[None], b[None]),
           "add": a + b, "cat": torch.cat([a, b.bfloat16()])}
print(" ".join(f"{k}={str(v.dtype).split('.')[-1]}" for k, v in out.items()))
"""


def _dtypes(env: dict[str, str]) -> dict[str, str]:
    proc = run([sys.executable, "-c", _PROBE], timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(item.split("=") for item in proc.stdout.split())


def test_lists_replace_the_default_autocast_lists(tmp_path) -> None:
    default = _dtypes({})
    assert default["mm"] == default["addmm"] == default["bmm"] == "bfloat16" and default["add"] == "float32"
    (tmp_path / "lower.txt").write_text("mm\nlinear\niadd\n")
    (tmp_path / "fp32.txt").write_text("softmax\n")
    listed = _dtypes({"PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST": str(tmp_path / "lower.txt"),
                      "PT_HPU_AUTOCAST_FP32_OPS_LIST": str(tmp_path / "fp32.txt")})
    assert listed["mm"] == listed["linear"] == "bfloat16"          # the lower-precision list
    assert listed["add"] == "float32"                               # iadd names the in-place add only
    assert listed["addmm"] == listed["bmm"] == "float32"            # defaults not listed: input dtype
    assert listed["softmax_of_bf16"] == "float32"                   # the fp32 list
    assert listed["cat"] == default["cat"] == "float32"             # promote ops keep promoting


def test_an_unreadable_list_is_an_error_naming_it(tmp_path) -> None:
    proc = run([sys.executable, "-c", _PROBE], timeout=120,
               env={"PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST": str(tmp_path / "missing.txt")})
    assert proc.returncode != 0 and "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST" in proc.stderr


_SCOPED = r"""
import torch, hpu_runtime
from hpu_runtime.bridge.autocast import op_lists
a, b = torch.randn(4, 4, device="hpu"), torch.randn(4, 4, device="hpu")

def probe(tag):
    with torch.autocast("hpu", dtype=torch.bfloat16):
        got = {"softmax": torch.softmax(a, -1), "mm": torch.mm(a, b), "layer_norm": torch.nn.functional.layer_norm(a, (4,))}
    print(tag + ":" + ",".join(f"{k}={str(v.dtype).split('.')[-1]}" for k, v in got.items()))

probe("before")
with op_lists(["softmax", "layer_norm"], ["mm"]):
    probe("inside")
probe("after")
"""


def test_op_lists_apply_inside_the_block_only(tmp_path) -> None:
    """``op_lists`` (a tracer planning a published run with its script's lists) replaces the
    process's lists inside the block and puts them back after it: with the environment's lists
    given, and with none (torch's defaults: softmax and layer_norm in fp32, mm in bf16)."""
    (tmp_path / "lower.txt").write_text("mm\nsoftmax\n")
    (tmp_path / "fp32.txt").write_text("layer_norm\n")
    for env, outside in (({}, "softmax=float32,mm=bfloat16,layer_norm=float32"),
                         ({"PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST": str(tmp_path / "lower.txt"),
                           "PT_HPU_AUTOCAST_FP32_OPS_LIST": str(tmp_path / "fp32.txt")},
                          "softmax=bfloat16,mm=bfloat16,layer_norm=float32")):
        proc = run([sys.executable, "-c", _SCOPED], timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = dict(line.split(":", 1) for line in proc.stdout.split())
        assert lines["before"] == lines["after"] == outside, (env, lines)
        assert lines["inside"] == "softmax=bfloat16,mm=float32,layer_norm=bfloat16", lines
