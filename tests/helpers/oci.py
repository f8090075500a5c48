"""Test images and a registry on loopback, for the tests and benchmarks of tasks with an image (docs/containers.md).

The registry is Debian's ``docker-registry`` started on 127.0.0.1 with a temporary config; images are built with
umoci from the host's own programs and the libraries they link to (nothing is downloaded), and pushed with
skopeo.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from tests.helpers.ports import free_port
from tests.integration.harness import Proc, wait_until

TOOLS = ("crun", "skopeo", "umoci", "docker-registry")
"""What running and serving images needs on the host (SYSTEM_TEST_PACKAGES)."""
PROGRAMS = ("/bin/sh", "/bin/cat", "/usr/bin/id", "/bin/ls", "/bin/sleep", "/usr/bin/head", "/usr/bin/tr", "/bin/date")
"""The small programs every test image carries in its /bin."""
MARK = "inside-the-image"
"""The content of a test image's /etc/motd."""


def missing_tools() -> list[str]:
    """Which of :data:`TOOLS` this host lacks."""
    return [t for t in TOOLS if shutil.which(t) is None]


def libraries(binary: str | Path) -> set[str]:
    """The absolute paths of the shared libraries ``binary`` (a program or a library) loads, as ``ldd`` lists them."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False).stdout
    libs = set()
    for line in out.splitlines():
        parts = line.split()
        path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts else ""
        if path.startswith("/"):
            libs.add(path)
    return libs


def build_image(where: Path, *, extra_libraries: Iterable[str] = (), env: Mapping[str, str] | None = None,
                files: Mapping[str, str] | None = None) -> Path:
    """An OCI layout at ``where/layout`` tagged ``t``: :data:`PROGRAMS` in /bin, the libraries they load and
    ``extra_libraries`` at their host paths, /etc/motd (:data:`MARK`) and ``files`` (path in the image → text);
    its config's environment is ``env`` (default ``PATH=/bin``) and its working directory /tmp."""
    layout, bundle = where / "layout", where / "bundle"
    run = lambda *a: subprocess.run(list(a), check=True, capture_output=True)   # noqa: E731
    run("umoci", "init", "--layout", str(layout))
    run("umoci", "new", "--image", f"{layout}:t")
    run("umoci", "unpack", "--image", f"{layout}:t", str(bundle))
    rootfs = bundle / "rootfs"
    for d in ("bin", "etc", "tmp", "data"):
        (rootfs / d).mkdir(exist_ok=True)
    (rootfs / "tmp").chmod(0o1777)
    libs = set(extra_libraries)
    for program in PROGRAMS:
        shutil.copy(program, rootfs / "bin" / Path(program).name)
        libs |= libraries(program)
    for lib in libs:
        target = rootfs / lib.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(lib, target)
    for path, text in {"/etc/motd": MARK + "\n", **(files or {})}.items():
        target = rootfs / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    run("umoci", "repack", "--image", f"{layout}:t", str(bundle))
    config = [f"--config.env={k}={v}" for k, v in (env or {"PATH": "/bin"}).items()]
    run("umoci", "config", "--image", f"{layout}:t", *config, "--config.workingdir", "/tmp")
    shutil.rmtree(bundle, ignore_errors=True)
    return layout


def push(layout: Path, address: str, name: str, tag: str = "t") -> str:
    """Copy ``layout``'s ``tag`` to the registry at ``address`` as ``name`` (``repo:tag``); returns the reference.
    Retried until the registry answers (it may still be starting)."""
    ref = f"{address}/{name}"

    def pushed() -> bool:
        done = subprocess.run(["skopeo", "copy", "--dest-tls-verify=false", f"oci:{layout}:{tag}", f"docker://{ref}"],
                              capture_output=True, check=False)
        return done.returncode == 0

    wait_until(pushed, 30, 0.3, what=f"{ref} pushed to the registry")
    return ref


@contextlib.contextmanager
def registry(top: Path) -> Iterator[str]:
    """A ``docker-registry`` on 127.0.0.1 keeping its data and log under ``top``; yields its HOST:PORT."""
    top.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = top / "config.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {top / 'data'}\n"
                      f"http:\n  addr: 127.0.0.1:{port}\n")
    proc = Proc(["docker-registry", "serve", str(config)], top / "registry.log").start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.stop()
