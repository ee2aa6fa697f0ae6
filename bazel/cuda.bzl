"""Detects the CUDA toolkit (nvcc) at fetch time.

Writes @local_cuda//:defs.bzl with HAS_CUDA and NVCC, and a `cuda_runtime`
cc_library (cudart + cuBLAS) that is empty when no toolkit is installed, so
every target builds on machines without CUDA.
"""

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = ctx.path(root + "/bin/nvcc")
    has = nvcc.exists
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("defs.bzl", "HAS_CUDA = %s\nNVCC = \"%s\"\nCUDA_ROOT = \"%s\"\n" % (
        "True" if has else "False",
        str(nvcc) if has else "",
        root,
    ))
    if has:
        build = """package(default_visibility = ["//visibility:public"])
cc_library(
    name = "cuda_runtime",
    includes = [],
    copts = ["-isystem", "{root}/include"],
    # cuBLAS is not linked: the CUDA model dlopens it (its static TLS would
    # break threads with small stacks; see gpu_worker/model/transformer_cuda.cu).
    linkopts = ["-L{root}/lib64", "-Wl,-rpath,{root}/lib64", "-lcudart", "-ldl"],
)
""".format(root = root)
    else:
        build = """package(default_visibility = ["//visibility:public"])
cc_library(name = "cuda_runtime")
"""
    ctx.file("BUILD", build)

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_HOME"],
    local = True,
)
