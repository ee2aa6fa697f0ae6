"""Repository rule exposing Debian system libraries to Bazel through pkg-config.

One cc_library per pkg-config package, named after the package with '-' and '+'
replaced ('grpc++' becomes 'grpcxx'). The list of packages lives in WORKSPACE.
"""

def _target_name(pkg):
    return pkg.replace("+", "x").replace("-", "_").replace(".", "_")

def _quote(flags):
    return "[" + ", ".join(['"%s"' % f for f in flags]) + "]"

def _pkg_config(ctx, args):
    res = ctx.execute(["pkg-config"] + args)
    if res.return_code != 0:
        fail("pkg-config %s failed: %s" % (" ".join(args), res.stderr))
    return [f for f in res.stdout.strip().split(" ") if f]

def _systemlibs_impl(ctx):
    lines = ['package(default_visibility = ["//visibility:public"])', ""]
    for pkg in ctx.attr.packages:
        cflags = _pkg_config(ctx, ["--cflags", pkg])
        libs = _pkg_config(ctx, ["--libs", pkg])

        # System include dirs are already searched; other -I flags become copts.
        copts = [f for f in cflags if f != "-I/usr/include"]
        lines.append("cc_library(")
        lines.append('    name = "%s",' % _target_name(pkg))
        lines.append("    copts = %s," % _quote(copts))
        lines.append("    linkopts = %s," % _quote(libs))
        lines.append(")")
        lines.append("")
    for name, pkgs in ctx.attr.groups.items():
        cflags = _pkg_config(ctx, ["--cflags"] + pkgs)
        libs = _pkg_config(ctx, ["--libs"] + pkgs)
        copts = [f for f in cflags if f != "-I/usr/include"]
        lines.append("cc_library(")
        lines.append('    name = "%s",' % name)
        lines.append("    copts = %s," % _quote(copts))
        lines.append("    linkopts = %s," % _quote(libs))
        lines.append(")")
        lines.append("")
    for pkg in ctx.attr.headers:
        # Header-only for dependents: each -I directory (not /usr/include) is
        # linked into this repository and becomes an include path of every
        # target that depends on this one (copts would not reach them).
        dirs = [f[2:] for f in _pkg_config(ctx, ["--cflags", pkg]) if f.startswith("-I") and f != "-I/usr/include"]
        includes = []
        for i, d in enumerate(dirs):
            link = "inc/%s/%d" % (_target_name(pkg), i)
            ctx.symlink(d, link)
            includes.append(link)
        lines.append("cc_library(")
        lines.append('    name = "%s",' % _target_name(pkg))
        lines.append("    hdrs = glob([%s]), " % ", ".join(['"%s/**/*.h"' % i for i in includes]))
        lines.append("    includes = %s," % _quote(includes))
        lines.append(")")
        lines.append("")
    for name, flags in ctx.attr.extra.items():
        lines.append("cc_library(")
        lines.append('    name = "%s",' % name)
        lines.append("    linkopts = %s," % _quote(flags.split(" ")))
        lines.append(")")
        lines.append("")
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("BUILD", "\n".join(lines))

systemlibs = repository_rule(
    implementation = _systemlibs_impl,
    attrs = {
        "packages": attr.string_list(),
        "groups": attr.string_list_dict(doc = "name -> several pkg-config packages in one target"),
        "extra": attr.string_dict(doc = "name -> linker flags, for libraries without a .pc file"),
        "headers": attr.string_list(doc = "pkg-config packages used for their headers alone (a Python extension's python3)"),
    },
    local = True,
)
