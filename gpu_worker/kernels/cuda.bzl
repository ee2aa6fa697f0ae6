"""cuda_or_stub_library: the CUDA backend, compiled by nvcc when present.

With the toolkit found by @local_cuda (bazel/cuda.bzl), a genrule runs nvcc
on the .cu (Hopper sm_90 SASS plus compute_90 PTX) into a static archive,
wrapped in a cc_library that links the CUDA runtime. Without it, the
cc_library is built from the stub sources instead. Everything is local: nvcc
is called by its absolute path and reads headers from the source tree and
/usr/include.
"""

load("@local_cuda//:defs.bzl", "HAS_CUDA", "NVCC")

# -fmad=false: no multiply-add contraction, so device arithmetic rounds like
# the CPU references (see cuda_backend.cu).
NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-Xcompiler",
    "-fPIC",
    "-gencode",
    "arch=compute_90,code=sm_90",
    "-gencode",
    "arch=compute_90,code=compute_90",
    "-fmad=false",
    "--Werror",
    "all-warnings",
]

def cuda_or_stub_library(name, cu_src, stub_srcs, headers = [], deps = [], visibility = None):
    """A cc_library from cu_src (nvcc) or, without CUDA, from stub_srcs.

    Args:
      name: the cc_library.
      cu_src: the .cu file.
      stub_srcs: C++ sources used when the build has no nvcc.
      headers: files the .cu includes (labels), so changes rebuild it.
      deps: cc_library deps of either variant (headers and link inputs).
      visibility: of the cc_library.
    """
    if HAS_CUDA:
        archive = "lib%s_nvcc.a" % name
        native.genrule(
            name = name + "_nvcc",
            srcs = [cu_src] + headers,
            outs = [archive],
            cmd = " ".join([NVCC] + NVCC_FLAGS + [
                "-I.",
                "-I$(GENDIR)",
                "-lib",
                "-o $@",
                "$(location %s)" % cu_src,
            ]),
            message = "nvcc " + cu_src,
        )
        native.cc_library(
            name = name,
            srcs = [":" + archive],
            deps = deps + ["@local_cuda//:cuda_runtime"],
            visibility = visibility,
        )
    else:
        native.cc_library(
            name = name,
            srcs = stub_srcs,
            copts = ["-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter"],
            deps = deps,
            visibility = visibility,
        )
