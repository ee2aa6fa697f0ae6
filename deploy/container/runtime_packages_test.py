#!/usr/bin/env python3
"""Checks that deploy/container/Containerfile installs what zenflowd links.

    runtime_packages_test.py ZENFLOWD CONTAINERFILE DEPENDS_SH

The Containerfile installs the zenflowd Debian package with apt-get install,
which installs the packages its Depends names; that Depends is what
deploy/debian/depends.sh (DEPENDS_SH) prints for zenflowd, as
deploy/debian/build_deb.sh writes it. The Containerfile must install the
.deb (not copy the binary). zenflowd is built against this machine's Debian
12 libraries, so the Debian package that holds each library it needs here is
the one the image needs. For every library in zenflowd's DT_NEEDED
(readelf), the owning package (dpkg -S on the path ldd resolves) must be in
the package's Depends or in the Containerfile's other apt-get install
arguments, or be in every Debian base image (an Essential package, apt, or
what they depend on). Every library ldd loads (the indirect ones too) must
then come from those packages or what they depend on, which apt installs
with them. Package relations are read from this machine's dpkg database,
so no network and no apt lists are needed.
"""

import os
import re
import subprocess
import sys


def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def containerfile_packages(path):
    """The arguments of the Containerfile's apt-get install (package names and .deb files)."""
    text = re.sub(r"\\\n", " ", open(path).read())
    m = re.search(r"apt-get install ([^&\n]*)", text)
    if not m:
        raise SystemExit(f"{path}: no apt-get install")
    return {w for w in m.group(1).split() if not w.startswith("-")}


def deb_depends(depends_sh, zenflowd):
    """The names in the zenflowd package's Depends (depends.sh's output)."""
    out = run(depends_sh, zenflowd)
    return {re.split(r"[ (]", alt.strip())[0] for dep in out.split(",") for alt in dep.split("|")
            if alt.strip()}


def owners(lib_paths):
    """lib path -> the Debian package holding it (merged-/usr aware), in one dpkg call."""
    candidates = {}
    for path in lib_paths:
        forms = {path, os.path.realpath(path)}
        forms |= {f[4:] if f.startswith("/usr/") else "/usr" + f for f in forms}
        candidates[path] = forms
    every = sorted(set().union(*candidates.values()))
    # Exits 1 when some forms are unknown (the other half of merged /usr).
    out = subprocess.run(["dpkg-query", "-S", *every], capture_output=True, text=True).stdout
    holder = {}
    for line in out.splitlines():
        pkgs, _, path = line.partition(": ")
        holder[path] = pkgs.split(",")[0].split(":")[0].strip()
    result = {}
    for path, forms in candidates.items():
        found = sorted(holder[f] for f in forms if f in holder)
        if not found:
            raise SystemExit(f"no Debian package holds {path}")
        result[path] = found[0]
    return result


def installed_relations():
    """Installed packages: name -> (essential, names it depends on)."""
    out = run("dpkg-query", "-W", "-f", "${Package}\t${Essential}\t${Pre-Depends}, ${Depends}\n")
    rel = {}
    for line in out.splitlines():
        name, essential, deps = line.split("\t")
        # "a (>= 1) | b, c:any" -> each alternative's name.
        names = {re.split(r"[ (:]", alt.strip())[0]
                 for dep in deps.split(",") for alt in dep.split("|") if alt.strip()}
        rel[name] = (essential == "yes", names)
    return rel


def closure(roots, rel):
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        todo.extend(d for d in rel.get(p, (False, set()))[1] if d in rel)
    return seen


def main(zenflowd, containerfile, depends_sh):
    args = containerfile_packages(containerfile)
    debs = {a for a in args if a.endswith(".deb")}
    failures = []
    if not any(re.search(r"(^|/)zenflowd_[^/]*_amd64\.deb$", d) for d in debs):
        failures.append("the Containerfile's apt-get install does not install the zenflowd "
                        f".deb (zenflowd_*_amd64.deb; it has {sorted(args)})")
    if re.search(r"^COPY\s+zenflowd\s", open(containerfile).read(), re.M):
        failures.append("the Containerfile copies a zenflowd binary: it installs the .deb instead")
    depends = deb_depends(depends_sh, zenflowd)
    print(f"the package's Depends: {', '.join(sorted(depends))}")
    listed = (args - debs) | depends
    rel = installed_relations()
    base = closure({p for p, (ess, _) in rel.items() if ess} | {"apt"}, rel)
    failures += [f"{p} is in the Containerfile or Depends but not installed here (misspelt or "
                 "wrong version?)" for p in sorted(listed - set(rel))]

    ldd = {}
    for line in run("ldd", zenflowd).splitlines():
        m = re.match(r"\s*(\S+) => (/\S+)", line)
        if m:
            ldd[m.group(1)] = m.group(2)
            continue
        # The dynamic loader has no "=>": its line is its path. A binary
        # names it in NEEDED when it uses the loader's own symbols
        # (__tls_get_addr, for thread_local in position-independent code).
        m = re.match(r"\s*(/\S+) \(0x", line)
        if m:
            ldd[os.path.basename(m.group(1))] = m.group(1)
    owner = owners(ldd.values())
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run("readelf", "-d", zenflowd))
    direct = {}
    for soname in needed:
        if soname not in ldd:
            failures.append(f"ldd does not resolve {soname}")
            continue
        direct.setdefault(owner[ldd[soname]], []).append(soname)
    for pkg, libs in sorted(direct.items()):
        if pkg not in listed and pkg not in base:
            failures.append(f"{pkg} (for {', '.join(libs)}) is not in the package's Depends, "
                            "the Containerfile's apt-get install nor a Debian base image")
    reach = closure(listed, rel) | base
    for soname, path in sorted(ldd.items()):
        pkg = owner[path]
        if pkg not in reach:
            failures.append(f"{soname} ({pkg}) comes with none of the installed packages")
    unused = listed - set(direct)
    if unused:
        print(f"note: installed but no direct library of zenflowd: {sorted(unused)}")
    print(f"{len(needed)} direct libraries from {len(direct)} packages, {len(ldd)} in all; "
          f"the image installs {len(listed)} packages with the .deb")
    for f in failures:
        print(f"FAIL {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: runtime_packages_test.py ZENFLOWD CONTAINERFILE DEPENDS_SH")
    sys.exit(main(*sys.argv[1:]))
