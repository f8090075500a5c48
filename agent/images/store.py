"""The node's image store: each image pulled and unpacked once, shared read-only by the tasks that use it.

Layout (``<state_dir>/images``, root's, 0700: tasks never see it from the host)::

    index.json                  reference → manifest digest, bytes, last use (rewritten atomically)
    rootfs/<digest hex>/        one unpacked image: rootfs/ and umoci's config.json; content-addressed by the
                                manifest's digest, so two references of the same image share it
    pull/<key>/                 a pull under way: skopeo's OCI layout, then umoci's unpacked tree (removed after)

A pull copies the reference into a temporary OCI layout with ``skopeo copy`` (registry credentials from the
node's auth file in ``containers-auth.json`` form, ``--authfile``; plain HTTP only for the registries the agent's
``--image-insecure-registries`` lists), unpacks it with ``umoci unpack`` and renames the tree into place under
its digest; the layout is removed. Failed pulls are retried with exponential backoff; the last error, as skopeo
reported the registry's answer, is what the task's FAILED reason says.

Two tasks asking for the same reference at once share one pull (one in-flight future per reference). Each task
holds the image it runs from (:meth:`ImageStore.acquire` / :meth:`ImageStore.release`); after each pull the store
evicts the least recently used images no task holds until it is under its size cap (an image in use is never
evicted, so the store may stay above the cap while they run).

A tag is pulled once: a cached reference is used as stored (like Kubernetes' ``IfNotPresent``); pin digests for
images that change.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.launch import root_env
from common.errors import GptrmError
from common.logging import get_logger
from common.oci import ImageRef

__all__ = ["Image", "ImageStore", "PullFailed", "tree_bytes"]

_TIMEOUT_S = 3600.0
_PROGRESS_S = 1.0
_ERROR_CHARS = 600
_LOGRUS = re.compile(r'msg="(.*)"\s*$')


class PullFailed(GptrmError):
    """An image could not be pulled or unpacked (the message carries skopeo's or umoci's own words)."""


@dataclass(frozen=True, slots=True)
class Image:
    """An unpacked image of the store."""

    ref: str
    digest: str
    bundle: Path                   # holds rootfs/ and config.json
    bytes: int

    @property
    def rootfs(self) -> Path:
        return self.bundle / "rootfs"

    def config(self) -> dict:
        """The runtime config umoci derived from the image (its env, working directory)."""
        try:
            return json.loads((self.bundle / "config.json").read_text())
        except (OSError, ValueError):
            return {}


def tree_bytes(path: Path) -> int:
    """Bytes a directory tree takes on disk (never following links)."""
    total = 0
    for root, dirs, files in os.walk(path, followlinks=False):
        for name in (*dirs, *files):
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def _key(ref: str) -> str:
    import hashlib

    return hashlib.sha256(ref.encode()).hexdigest()[:32]


class ImageStore:
    """See the module docstring.

    :param root: the store's directory.
    :param max_bytes: the size cap (0: none).
    :param auth_file: a ``containers-auth.json`` file of registry credentials ("" none).
    :param insecure: registries (``HOST[:PORT]``) reached over plain HTTP or unverified TLS.
    :param skopeo, umoci: absolute paths of the programs.
    """

    def __init__(self, root: Path, *, skopeo: str, umoci: str, max_bytes: int = 0, auth_file: str = "",
                 insecure: tuple[str, ...] = (), retries: int = 3, backoff_s: float = 1.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.root = Path(root)
        for d in (self.root, self.root / "rootfs", self.root / "pull"):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o700)
        shutil.rmtree(self.root / "pull", ignore_errors=True)   # what a stopped agent left half pulled
        (self.root / "pull").mkdir(mode=0o700, exist_ok=True)
        self._skopeo, self._umoci = skopeo, umoci
        self.max_bytes = max_bytes
        self._auth = auth_file
        self._insecure = frozenset(insecure)
        self._retries, self._backoff_s = max(1, retries), backoff_s
        self._clock = clock
        self._index: dict[str, dict] = self._load()
        self._pulls: dict[str, asyncio.Future[Image]] = {}
        self._listeners: dict[str, list[Callable[[str], None]]] = {}   # reference → who follows its pull
        self._users: dict[str, str] = {}    # task id → digest it runs from
        self.on_change: Callable[[], None] | None = None   # told after each change of the index (the stream's kick)
        self.pulls_done = 0                 # pulls that went to the registry (tests, metrics)
        self._log = get_logger("agent").bind(component="images")

    # ---- index ------------------------------------------------------------------------------

    def _load(self) -> dict[str, dict]:
        try:
            data = json.loads((self.root / "index.json").read_text())
        except (OSError, ValueError):
            return {}
        images = data.get("images", {}) if isinstance(data, dict) else {}
        return {ref: e for ref, e in images.items() if isinstance(e, dict) and (self.root / "rootfs" / str(
            e.get("digest", "")).removeprefix("sha256:")).is_dir()}

    def _save(self) -> None:
        tmp = self.root / "index.json.tmp"
        tmp.write_text(json.dumps({"images": self._index}))
        os.replace(tmp, self.root / "index.json")
        if self.on_change is not None:
            self.on_change()

    def _image(self, ref: str) -> Image | None:
        e = self._index.get(ref)
        if e is None:
            return None
        bundle = self.root / "rootfs" / str(e["digest"]).removeprefix("sha256:")
        if not bundle.is_dir():
            return None
        return Image(ref, str(e["digest"]), bundle, int(e.get("bytes", 0)))

    def refs(self) -> list[str]:
        """The references the store holds, sorted (what the node reports)."""
        return sorted(self._index)

    def images(self) -> list[Image]:
        """What the store holds, most recently used first."""
        refs = sorted(self._index, key=lambda r: -float(self._index[r].get("last_used", 0)))
        return [img for r in refs if (img := self._image(r)) is not None]

    def total_bytes(self) -> int:
        return sum(int(e.get("bytes", 0)) for e in {str(e["digest"]): e for e in self._index.values()}.values())

    # ---- use --------------------------------------------------------------------------------

    async def acquire(self, ref: ImageRef, task_id: str, progress: Callable[[str], None] | None = None) -> Image:
        """The unpacked image of ``ref``, pulled first when the store lacks it; held for ``task_id`` until
        :meth:`release`.

        :raises PullFailed: with the registry's (or umoci's) error after the last retry.
        """
        image = self._image(ref.text)
        if image is None:
            pending = self._pulls.get(ref.text)
            if pending is None:
                # The pull is a task of its own: a waiter cancelled (its task stopped) does not end it for the others.
                pending = asyncio.ensure_future(self._pull(ref, lambda text: self._progress(ref.text, text)))
                pending.add_done_callback(functools.partial(self._pull_done, ref.text))
                self._pulls[ref.text] = pending
            elif progress is not None:
                progress(f"waiting for the pull of {ref.text} under way")
            listeners = self._listeners.setdefault(ref.text, [])
            if progress is not None:
                listeners.append(progress)
            try:
                image = await asyncio.shield(pending)
            finally:
                if progress is not None and progress in listeners:
                    listeners.remove(progress)
        self._users[task_id] = image.digest
        self._index[ref.text]["last_used"] = self._clock()
        self._save()
        await self.evict()
        return image

    def _progress(self, ref: str, text: str) -> None:
        for listener in list(self._listeners.get(ref, ())):
            listener(text)

    def _pull_done(self, ref: str, future: asyncio.Future[Image]) -> None:
        self._pulls.pop(ref, None)
        self._listeners.pop(ref, None)
        if not future.cancelled():
            future.exception()   # read: no "never retrieved" warning when every waiter went away

    def pulling(self, ref: str) -> bool:
        """Whether ``ref`` is being pulled now."""
        return ref in self._pulls

    def has(self, ref: str) -> bool:
        """Whether the store holds ``ref`` unpacked (a start needs no pull)."""
        return self._image(ref) is not None

    def hold(self, ref: str, task_id: str) -> None:
        """After an agent restart: ``task_id`` still runs from the image of ``ref`` (never evicted under it)."""
        entry = self._index.get(ref)
        if entry is not None:
            self._users[task_id] = str(entry["digest"])

    def release(self, task_id: str) -> None:
        """The task no longer runs from its image (it may be evicted from now on)."""
        self._users.pop(task_id, None)

    async def evict(self) -> list[str]:
        """Remove the least recently used images no task holds until the store is under its cap; the references
        removed."""
        removed: list[str] = []
        if not self.max_bytes:
            return removed
        # Chosen, unlisted and moved aside with no await in between, so a start that holds an image meanwhile
        # either holds it before it is chosen (and it stays) or finds it gone (and pulls it again).
        trash: list[Path] = []
        for ref in sorted(self._index, key=lambda r: float(self._index[r].get("last_used", 0))):
            if self.total_bytes() <= self.max_bytes:
                break
            digest = str(self._index[ref]["digest"])
            if digest in set(self._users.values()):
                continue
            del self._index[ref]
            removed.append(ref)
            if not any(str(e["digest"]) == digest for e in self._index.values()):
                tree = self.root / "rootfs" / digest.removeprefix("sha256:")
                aside = self.root / "pull" / f"evicted-{digest.removeprefix('sha256:')}"
                with contextlib.suppress(OSError):
                    os.rename(tree, aside)
                    trash.append(aside)
        if removed:
            self._save()
            for aside in trash:
                await asyncio.to_thread(shutil.rmtree, aside, True)
            self._log.info("images_evicted", refs=removed, total_bytes=self.total_bytes(), max_bytes=self.max_bytes)
        return removed

    # ---- pulling ----------------------------------------------------------------------------

    async def _pull(self, ref: ImageRef, progress: Callable[[str], None] | None) -> Image:
        delay = self._backoff_s
        for attempt in range(1, self._retries + 1):
            try:
                return await self._pull_once(ref, progress)
            except PullFailed as e:
                if attempt == self._retries or not _retryable(str(e)):
                    self._log.warning("image_pull_failed", ref=ref.text, attempt=attempt, error=str(e))
                    raise
                self._log.info("image_pull_retry", ref=ref.text, attempt=attempt, error=str(e), delay_s=delay)
                await asyncio.sleep(delay)
                delay *= 2
        raise PullFailed(f"image {ref.text}: not pulled")   # not reached

    async def _pull_once(self, ref: ImageRef, progress: Callable[[str], None] | None) -> Image:
        work = self.root / "pull" / _key(ref.text)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(mode=0o700)
        try:
            layout = work / "layout"
            argv = [self._skopeo, "--insecure-policy", "copy", "--quiet"]
            if self._auth:
                argv.append(f"--authfile={self._auth}")
            domain = ref.name.split("/", 1)[0] if ref.transport == "docker" else ""
            if domain in self._insecure:
                argv.append("--src-tls-verify=false")
            argv += [ref.skopeo, f"oci:{layout}:image"]
            self._log.info("image_pull_started", ref=ref.text)
            await self._run(argv, f"image {ref.text}: pull failed", progress=progress, watch=layout, ref=ref.text)
            digest = _manifest_digest(layout)
            bundle = self.root / "rootfs" / digest.removeprefix("sha256:")
            if not bundle.is_dir():
                if progress is not None:
                    progress(f"unpacking {ref.text}")
                unpacked = work / "bundle"
                await self._run([self._umoci, "unpack", "--image", f"{layout}:image", str(unpacked)],
                                f"image {ref.text}: unpack failed")
                for name in os.listdir(unpacked):
                    if name not in ("rootfs", "config.json"):
                        path = unpacked / name
                        (shutil.rmtree if path.is_dir() else os.unlink)(path)
                os.chmod(unpacked, 0o700)
                os.rename(unpacked, bundle)
            size = await asyncio.to_thread(tree_bytes, bundle)
            self._index[ref.text] = {"digest": digest, "bytes": size, "last_used": self._clock(),
                                     "pulled": self._clock()}
            self._save()
            self.pulls_done += 1
            self._log.info("image_pulled", ref=ref.text, digest=digest, bytes=size)
            image = self._image(ref.text)
            assert image is not None
            return image
        finally:
            await asyncio.to_thread(shutil.rmtree, work, True)

    async def _run(self, argv: list[str], what: str, *, progress: Callable[[str], None] | None = None,
                   watch: Path | None = None, ref: str = "") -> None:
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.STDOUT,
                                                        env={**root_env(), "HOME": str(self.root)})
        except OSError as e:
            raise PullFailed(f"{what}: cannot run {argv[0]}: {e.strerror or e}") from e
        out = asyncio.ensure_future(proc.communicate())
        deadline = time.monotonic() + _TIMEOUT_S
        try:
            while not out.done():
                if time.monotonic() > deadline:
                    raise PullFailed(f"{what}: no answer within {_TIMEOUT_S:.0f} s (timed out)")
                if progress is not None and watch is not None:
                    done = await asyncio.to_thread(tree_bytes, watch) if watch.exists() else 0
                    progress(f"pulling {ref}: {done} bytes")
                await asyncio.wait([out], timeout=_PROGRESS_S)
            text = (await out)[0].decode(errors="replace").strip()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        if proc.returncode != 0:
            raise PullFailed(f"{what}: {_last_error(text)}")


def _retryable(error: str) -> bool:
    """Whether a pull error may go away on its own (network, registry overload), not a wrong name or a refusal."""
    final = ("manifest unknown", "name unknown", "unauthorized", "denied", "not found", "no such file",
             "invalid reference", "requested access to the resource is denied")
    return not any(word in error.lower() for word in final)


def _last_error(text: str) -> str:
    """The last line a program wrote, without logrus' ``time=... level=fatal msg="..."`` frame."""
    lines = [line for line in text.splitlines() if line.strip()]
    last = lines[-1] if lines else "no output"
    framed = _LOGRUS.search(last)
    if framed is not None:
        last = framed.group(1).replace('\\"', '"')
    return last[-_ERROR_CHARS:]


def _manifest_digest(layout: Path) -> str:
    """The digest of the one manifest skopeo wrote into ``layout``."""
    try:
        index = json.loads((layout / "index.json").read_text())
        digest = str(index["manifests"][0]["digest"])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        raise PullFailed(f"the pulled image's layout has no manifest ({e})") from e
    algo, _, hexpart = digest.partition(":")
    if algo != "sha256" or len(hexpart) != 64 or any(c not in "0123456789abcdef" for c in hexpart):
        raise PullFailed(f"unexpected manifest digest {digest[:80]!r}")
    return digest

