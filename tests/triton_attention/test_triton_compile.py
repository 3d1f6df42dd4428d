"""The kernels compile for sm_90 (H100/H200) without a GPU, with the tiles the launchers pick on CUDA,
and ptxas reports no register spills: what only the compiler rejects, the interpreter tests miss.

The compiling runs in a subprocess without TRITON_INTERPRET: in this process triton.language itself
was loaded for the interpreter."""
import json
import os
import subprocess
import sys
import tempfile

import pytest

INDEX_ARGS = {"slot_mapping_ptr": "*i64", "cu_seqlens_q_ptr": "*i32", "seq_lens_ptr": "*i32",
              "block_tables_ptr": "*i32"}

# The launchers' CUDA choices for SmolLM2 (9/3 heads, d64) and an 8B-class layer (32/8 heads, d128).
CASES = {
    "store d64": ("store_kv", "_store_kv_kernel", dict(ROW=192, BLOCK=256), 4),
    "store d128": ("store_kv", "_store_kv_kernel", dict(ROW=1024, BLOCK=1024), 4),
    "extend d64": ("extend_attention", "_extend_attention_kernel",
                   dict(GROUP=3, BLOCK_G=4, BLOCK_SIZE=16, HEAD_DIM=64, BLOCK_D=64, BLOCK_M=128, TOKENS_M=32,
                        BLOCK_N=64, SOFTCAP=False, UPCAST=False, PRECISION="tf32"), 8),
    "extend d128": ("extend_attention", "_extend_attention_kernel",
                    dict(GROUP=4, BLOCK_G=4, BLOCK_SIZE=16, HEAD_DIM=128, BLOCK_D=128, BLOCK_M=64, TOKENS_M=16,
                         BLOCK_N=64, SOFTCAP=False, UPCAST=False, PRECISION="tf32"), 8),
}


def _compile_all() -> dict:
    """Run in the subprocess: each case's `cuobjdump -res-usage` line, or its error."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    results = {}
    for case, (module, name, constexprs, num_warps) in CASES.items():
        fn = getattr(importlib.import_module(f"batchinfer.engine.kernels.{module}"), name)
        signature = {arg: "constexpr" if arg in constexprs else INDEX_ARGS.get(arg) or (
            "*bf16" if arg.endswith("_ptr") else "fp32" if arg == "scale_log2" else "i32") for arg in fn.arg_names}
        try:
            source = ASTSource(fn, signature, {(fn.arg_names.index(k),): v for k, v in constexprs.items()})
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
            with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
                cubin.write(compiled.asm["cubin"])
                cubin.flush()
                usage = subprocess.run([cuobjdump, "-res-usage", cubin.name], capture_output=True, text=True,
                                       check=True).stdout
            results[case] = next(line.strip() for line in usage.splitlines() if "REG:" in line)
        except Exception as exc:  # reported per case by the test
            results[case] = f"ERROR {type(exc).__name__}: {exc}"
    return results


@pytest.fixture(scope="module")
def resource_usage() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    proc = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES)
def test_triton_kernel_compiles_for_sm90_without_register_spills(resource_usage, case):
    usage = resource_usage[case]
    assert not usage.startswith("ERROR"), usage
    assert "STACK:0 " in usage and "LOCAL:0 " in usage, usage


if __name__ == "__main__":
    print(json.dumps(_compile_all()))
