"""One fuzz target: its libFuzzer binary and its regression test."""

load("//bazel:copts.bzl", "ZF_COPTS")

def zf_fuzz_target(name, srcs, deps = []):
    """`name`_fuzzer and `name`_regression_test from the same sources.

    `name`_fuzzer is the libFuzzer binary with --config=fuzz (clang,
    ASan/UBSan; ./zf fuzz builds and runs it); with any other configuration it
    is the replay driver. It is tagged manual: //... leaves it out.
    `name`_regression_test runs the target once over every file of
    corpus/`name` (which must not be empty) and regressions/`name`.
    """
    native.cc_binary(
        name = name + "_fuzzer",
        srcs = srcs,
        copts = ZF_COPTS,
        linkopts = select({
            "//fuzz:libfuzzer": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        tags = ["manual"],
        deps = deps + select({
            "//fuzz:libfuzzer": [],
            "//conditions:default": ["//fuzz:replay_main"],
        }),
    )
    native.cc_test(
        name = name + "_regression_test",
        size = "small",
        srcs = srcs,
        args = [
            "--require",
            "fuzz/corpus/" + name,
            "fuzz/regressions/" + name,
        ],
        copts = ZF_COPTS,
        data = native.glob([
            "corpus/%s/*" % name,
            "regressions/%s/*" % name,
        ]),
        deps = deps + ["//fuzz:replay_main"],
    )
