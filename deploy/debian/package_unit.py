#!/usr/bin/env python3
"""deploy/systemd/zenflowd.service as the Debian package installs it (stdin to stdout).

The binary is /usr/bin/zenflowd, and the service runs as the package's
system user zenflowd (made by postinst) instead of a DynamicUser: its
checkpoints in /var/lib/zenflowd keep one owner. DynamicUser= implied
nothing the unit does not already say itself (PrivateTmp, RemoveIPC,
NoNewPrivileges, RestrictSUIDSGID, ProtectSystem=strict, ProtectHome).
The install notes at the top become the package's. Each change must find
its line, so a change to the source unit that breaks one fails the build.
"""

import re
import sys

unit = sys.stdin.read()


def replace(pattern, repl, count=1):
    global unit
    new, n = re.subn(pattern, repl, unit, flags=re.M | re.S)
    if n < count:
        raise SystemExit(f"package_unit.py: the unit has no match for {pattern!r}")
    unit = new


replace(r"^# Install \(as root\):.*?^#   systemctl daemon-reload && systemctl enable --now zenflowd\n",
        "# Installed by the zenflowd Debian package. To run it (as root): edit\n"
        "# /etc/zenflowd/zenflowd.flags for this host (--listen), put server.crt,\n"
        "# server.key and ca.crt into /etc/zenflowd/tls/ (mode 0600; see\n"
        "# LoadCredential= below), then: systemctl enable --now zenflowd\n")
replace(r"^ExecStart=/usr/local/bin/zenflowd ", "ExecStart=/usr/bin/zenflowd ")
replace(r"^# Identity and files\. A transient user with no home;",
        "# Identity and files. The package's system user zenflowd (postinst makes it);")
replace(r"^DynamicUser=yes\n", "User=zenflowd\nGroup=zenflowd\n")
sys.stdout.write(unit)
