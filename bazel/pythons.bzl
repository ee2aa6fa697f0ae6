"""Repository rule exposing the headers of every CPython 3 on this machine.

The extension module python/_zenflow.so is compiled against one
interpreter's headers and links no libpython, so a wheel for another
interpreter (./zf wheel) needs only a different include directory. This
rule makes one header-only cc_library per CPython minor version, named
"cp3X": Debian's own python3 (found through pkg-config, as @sys//:python3)
and each pyenv interpreter ($PYENV_ROOT or ~/.pyenv, versions/*/include/python3.X).
A version that is not on this machine gets a target whose Python.h stops
the compile with a message saying so. python/BUILD.bazel selects one with
--define=zf_python=3.X.
"""

# The versions a wheel can be asked for; pybind11 2.10 (Debian 12's) needs 3.6
# or newer, and the package itself 3.8 or newer.
PYTHON_VERSIONS = ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13"]

def _tag(version):
    return "cp" + version.replace(".", "")

def _pythons_impl(ctx):
    found = {}

    # pyenv's interpreters first, so that Debian's own takes the version it has.
    root = ctx.os.environ.get("PYENV_ROOT") or (ctx.os.environ.get("HOME", "") + "/.pyenv")
    versions = ctx.path(root + "/versions")
    if versions.exists:
        by_name = {p.basename: p for p in versions.readdir()}
        for n in sorted(by_name):
            v = by_name[n]
            for version in PYTHON_VERSIONS:
                inc = v.get_child("include").get_child("python" + version)
                if v.basename.startswith(version + ".") and inc.get_child("Python.h").exists:
                    found[version] = str(inc)
    res = ctx.execute(["pkg-config", "--cflags-only-I", "python3"])
    if res.return_code == 0:
        for flag in res.stdout.split(" "):
            d = flag.strip()[2:]
            if d.startswith("/usr/include/python3."):
                found[d[len("/usr/include/python"):]] = d

    lines = ['package(default_visibility = ["//visibility:public"])', ""]
    for version in PYTHON_VERSIONS:
        name = _tag(version)
        if version in found:
            ctx.symlink(found[version], "inc/" + name)
        else:
            ctx.file("inc/%s/Python.h" % name, "#error \"CPython %s's headers are not on this machine " % version +
                                                "(neither Debian's python%s-dev nor %s/versions/%s.*/include)\"\n" % (version, root, version))
        lines.append("cc_library(")
        lines.append('    name = "%s",' % name)
        lines.append('    hdrs = glob(["inc/%s/**/*.h"]),' % name)
        lines.append('    includes = ["inc/%s"],' % name)
        lines.append(")")
        lines.append("")
    ctx.file("found.txt", "".join(["%s %s\n" % (v, found[v]) for v in PYTHON_VERSIONS if v in found]))
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("BUILD", "\n".join(lines))

pythons = repository_rule(
    implementation = _pythons_impl,
    environ = ["HOME", "PYENV_ROOT"],
    local = True,
)
