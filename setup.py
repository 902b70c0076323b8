"""Build allocconf._C strictly.

Switches (environment variables, read at build time):
  ALLOCCONF_WERROR=1       add -Werror (CI and development builds do)
  ALLOCCONF_DEBUG_BUILD=1  -O0 -g3 instead of the optimised build
  ALLOCCONF_SANITIZE=...   e.g. "address,undefined": build with those
                           sanitizers (see tools/sanitized-tests.sh)

The build fails loudly if the extension does not compile: there is no
pure-Python fallback.
"""
import glob
import os
import sys

from setuptools import Extension, setup

# Every C file of csrc/, layer by layer (docs/design.md, "Layers").
LAYERS = ("grammar", "driver", "state", "torchio", "api")
SOURCES = [f for layer in LAYERS
           for f in sorted(glob.glob(f"csrc/{layer}/*.c"))] + ["csrc/module.c"]


def _flags():
    if sys.platform == "win32":
        return ["/W4"], []
    compile_args = ["-std=c11", "-Wall", "-Wextra", "-Wshadow",
                    "-Wstrict-prototypes", "-fvisibility=hidden"]
    link_args = []
    if os.environ.get("ALLOCCONF_WERROR") == "1":
        compile_args.append("-Werror")
    if os.environ.get("ALLOCCONF_DEBUG_BUILD") == "1":
        compile_args += ["-O0", "-g3", "-UNDEBUG"]
    sanitize = os.environ.get("ALLOCCONF_SANITIZE")
    if sanitize:
        flag = "-fsanitize=" + sanitize
        compile_args += [flag, "-fno-omit-frame-pointer", "-g",
                         "-fno-sanitize-recover=all"]
        link_args.append(flag)
    return compile_args, link_args


compile_args, link_args = _flags()

setup(
    ext_modules=[
        Extension(
            "allocconf._C",
            sources=SOURCES,
            depends=sorted(glob.glob("csrc/**/*.h", recursive=True)),
            include_dirs=["csrc"],
            extra_compile_args=compile_args,
            extra_link_args=link_args,
            libraries=["dl"] if sys.platform.startswith("linux") else [],
        )
    ],
)
