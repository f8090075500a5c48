"""Container images and mounts of a task spec: the one parser of their text forms (``docs/containers.md``).

Used by the coordinator when a task is submitted (each problem a :class:`ValidationError` naming the field) and by
the agent when it pulls an image and builds a container's mounts, so both read a reference the same way.

Image references, in the transport names ``skopeo`` uses:

- ``REGISTRY[:PORT]/NAME[:TAG]`` or ``NAME[:TAG]`` (Docker Hub), optionally ``@sha256:HEX`` (a digest pins it);
- ``oci-archive:PATH[:REF]`` and ``docker-archive:PATH`` for air-gapped sites (an archive file on the node,
  below a root an admin allows, like a mount's source).

Mounts are ``SRC:DST[:ro]``: absolute, normalized host and container paths (no ``..``, no ``:``), the container
path never one the runtime owns (``/proc``, ``/sys``, ``/dev``).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from common.errors import ValidationError

__all__ = ["ARCHIVE_TRANSPORTS", "CONTAINERS_LABEL", "MAX_MOUNTS", "ImageRef", "Mount", "below", "host_root",
           "parse_image", "parse_mount", "validate_container"]

ARCHIVE_TRANSPORTS = ("oci-archive", "docker-archive")
CONTAINERS_LABEL = "gptrm.io/containers"
"""The label (value ``true``) a node's placement snapshot carries when its agent runs tasks with an image, and that a
task with an image selects: placement's own label constraint keeps such a task off the nodes that cannot run it."""
MAX_MOUNTS = 32
MAX_REF_CHARS = 512
MAX_SHM_BYTES = 1 << 40
RESERVED_DESTINATIONS = ("/proc", "/sys", "/dev")

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?"
_REFERENCE = re.compile(
    rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@(?P<digest>sha256:[a-f0-9]{64}))?$")


@dataclass(frozen=True, slots=True)
class ImageRef:
    """A parsed image reference: ``transport`` is ``docker`` (a registry) or an archive transport."""

    text: str                 # as given
    transport: str
    name: str = ""            # registry reference, normalized (``docker.io/library/x:latest``); "" for archives
    path: str = ""            # the archive file (archives only)
    digest: str = ""          # sha256:HEX when pinned

    @property
    def skopeo(self) -> str:
        """The source argument ``skopeo copy`` takes."""
        return f"docker://{self.name}" if self.transport == "docker" else self.text


@dataclass(frozen=True, slots=True)
class Mount:
    """A host path bound into a container."""

    source: str
    destination: str
    read_only: bool


def _clean_path(value: str, field: str, what: str) -> str:
    if not value.startswith("/"):
        raise ValidationError(field, f"{what} {value[:128]!r} must be an absolute path")
    if "\0" in value or "\n" in value:
        raise ValidationError(field, f"{what} must not hold NUL or newline")
    cleaned = value.rstrip("/") or "/"
    if any(part in (".", "..") for part in value.split("/")) or posixpath.normpath(cleaned) != cleaned:
        raise ValidationError(field, f"{what} {value[:128]!r} must be a normalized path (no '.', '..' or '//')")
    return cleaned


def parse_image(text: str, field: str = "spec.image") -> ImageRef:
    """:raises ValidationError: on ``field`` when ``text`` is none of the accepted forms."""
    if not text or len(text) > MAX_REF_CHARS:
        raise ValidationError(field, f"must be 1..{MAX_REF_CHARS} characters")
    transport, sep, rest = text.partition(":")
    if sep and transport in ARCHIVE_TRANSPORTS:
        path = rest.split(":", 1)[0] if transport == "oci-archive" else rest
        if ":" in path or not path:
            raise ValidationError(field, f"{transport}: needs a file path, got {rest[:128]!r}")
        return ImageRef(text, transport, path=_clean_path(path, field, "archive"))
    match = _REFERENCE.match(text)
    if match is None:
        raise ValidationError(field, f"{text[:128]!r} is not an image reference (REGISTRY/NAME:TAG, NAME@sha256:HEX, "
                                     "oci-archive:PATH or docker-archive:PATH)")
    domain, path = match["domain"], match["path"]
    if domain is None or ("." not in domain and ":" not in domain and domain != "localhost"):
        # Docker's rule: a first component without a dot or port is a path on Docker Hub.
        path = f"{domain}/{path}" if domain else path
        domain = "docker.io"
        if "/" not in path:
            path = f"library/{path}"
    tag = match["tag"] or ("" if match["digest"] else "latest")
    name = f"{domain}/{path}" + (f":{tag}" if tag else "") + (f"@{match['digest']}" if match["digest"] else "")
    return ImageRef(text, "docker", name=name, digest=match["digest"] or "")


def parse_mount(text: str, field: str = "spec.mounts") -> Mount:
    """:raises ValidationError: on ``field`` when ``text`` is not ``SRC:DST[:ro]`` with clean absolute paths."""
    parts = text.split(":")
    read_only = len(parts) == 3 and parts[2] == "ro"
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ValidationError(field, f"{text[:128]!r}: expected SRC:DST or SRC:DST:ro (paths without ':')")
    source = _clean_path(parts[0], field, "source")
    destination = _clean_path(parts[1], field, "destination")
    if destination == "/" or any(below(destination, r) for r in RESERVED_DESTINATIONS):
        raise ValidationError(field, f"destination {destination!r} is the runtime's own (/, /proc, /sys, /dev)")
    return Mount(source, destination, read_only)


def host_root(value: str, field: str) -> str:
    """An allowed host root as configured (a queue's ``mount_allowed``): an absolute, normalized path.

    :raises ValidationError: on ``field`` otherwise."""
    if not isinstance(value, str):
        raise ValidationError(field, f"{value!r} is not a path")
    return _clean_path(value, field, "root")


def below(path: str, root: str) -> bool:
    """Whether the normalized ``path`` is ``root`` or lies under it (by components, not by text)."""
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root + "/") or root == "/"


def validate_container(image: str, mounts: Sequence[str], workdir: str, shm_bytes: int,
                       allowed: Sequence[str] | None = None, image_field: str = "spec.image") -> None:
    """The container fields of a spec. ``allowed``: host roots mounts and archives must lie under (None: the
    syntax only; empty: no host path at all).

    :raises ValidationError: naming ``spec.image``, ``spec.mounts[i]``, ``spec.workdir`` or ``spec.shm_bytes``.
    """
    if not image:
        for name, given in (("spec.mounts", bool(mounts)), ("spec.workdir", bool(workdir)),
                            ("spec.shm_bytes", bool(shm_bytes))):
            if given:
                raise ValidationError(name, "is for a task with an image (spec.image)")
        return
    ref = parse_image(image, image_field)
    if ref.path and allowed is not None and not any(below(ref.path, r) for r in allowed):
        raise ValidationError(image_field, f"archive {ref.path!r} is not below a host path the cluster allows "
                                            f"({', '.join(allowed) or 'none'}: the coordinator's --mount-allowed)")
    if len(mounts) > MAX_MOUNTS:
        raise ValidationError("spec.mounts", f"{len(mounts)} mounts is more than {MAX_MOUNTS}")
    seen: set[str] = set()
    for i, text in enumerate(mounts):
        m = parse_mount(text, f"spec.mounts[{i}]")
        if m.destination in seen:
            raise ValidationError(f"spec.mounts[{i}]", f"destination {m.destination!r} is mounted twice")
        seen.add(m.destination)
        if allowed is not None and not any(below(m.source, r) for r in allowed):
            raise ValidationError(f"spec.mounts[{i}]",
                                  f"source {m.source!r} is not below a host path the cluster allows "
                                  f"({', '.join(allowed) or 'none'}: the coordinator's --mount-allowed)")
    if workdir:
        _clean_path(workdir, "spec.workdir", "workdir")
    if shm_bytes > MAX_SHM_BYTES:
        raise ValidationError("spec.shm_bytes", f"{shm_bytes} is more than {MAX_SHM_BYTES} (1 TiB)")
