"""Build of the C extension pld._core (metadata lives in pyproject.toml).

PLD_SANITIZE=1 builds it with AddressSanitizer and UndefinedBehaviorSanitizer
(run Python with the sanitizer runtimes in LD_PRELOAD, see .ci/run).
"""
import os
import sys

from setuptools import Extension, setup

SOURCES = [
    "csrc/pld_lookup.c",
    "csrc/pld_index.c",
    "csrc/pld_accept.c",
    "csrc/pld_corpus.c",
    "csrc/pld_module.c",
]


def compile_args():
    if sys.platform == "win32":
        return ["/O2", "/W4"], []
    args = ["-std=c11", "-O3", "-Wall", "-Wextra", "-Wno-missing-field-initializers",
            "-fvisibility=hidden"]
    link = []
    if os.environ.get("PLD_SANITIZE") == "1":
        san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
               "-fno-omit-frame-pointer", "-g"]
        args = [a for a in args if a != "-O3"] + ["-O1"] + san
        link = san
    return args, link


cflags, ldflags = compile_args()

setup(
    ext_modules=[
        Extension(
            "pld._core",
            sources=SOURCES,
            include_dirs=["csrc"],
            depends=["csrc/pld.h", "csrc/pld_internal.h", "csrc/pld_rules.h", "csrc/dlpack_abi.h"],
            extra_compile_args=cflags,
            extra_link_args=ldflags,
        )
    ],
)
