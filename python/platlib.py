# SPDX-License-Identifier: MIT
"""Prints where `cmake --install` puts the package for install prefix argv[1] (CMakeLists.txt).
Debian's posix_local scheme already adds /local to its base, so /usr/local is given as /usr."""
import sys
import sysconfig

p = sys.argv[1].rstrip("/")
if "posix_local" in sysconfig.get_scheme_names() and p.endswith("/local"):
    print(sysconfig.get_path("platlib", "posix_local", vars={"platbase": p[:-6], "base": p[:-6]}))
else:
    print(sysconfig.get_path("platlib", "posix_prefix", vars={"platbase": p, "base": p}))
