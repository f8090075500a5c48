"""``gptrmctl certs``: the cluster's CA, certificates, revocation and bearer tokens (no coordinator needed).

    gptrmctl certs ca create [--dir DIR]
    gptrmctl certs issue node NAME | ROLE NAME | coordinator HOST [HOST...] [--days N] [--queues A,B]
        ROLE: admin (cluster admin), queue-admin (its queues and those below them; --queues required),
        submitter (submits to and acts on its queues' tasks), viewer (read-only, secrets redacted);
        --queues: the queues the holder may submit to, first the default
    gptrmctl certs revoke CERT_FILE            (adds it to DIR/crl.pem; coordinators read --tls-crl)
    gptrmctl certs token NAME ROLE [--queues A,B]
                                               (prints the token once and the --admin-tokens line)

What each role may do, and which fields are secret: docs/tenants.md.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from common.errors import GptrmError
from coordinator import certs, tokens
from coordinator.ctl.argtypes import int_between
from coordinator.ctl.transport import EXIT_REFUSED, EXIT_USAGE, CtlError

__all__ = ["add_certs_parser"]

DEFAULT_DIR = "gptrm-pki"


def _dir(args: argparse.Namespace) -> Path:
    return Path(args.dir or os.environ.get("GPTRM_PKI_DIR", DEFAULT_DIR))


def _run(fn: Any) -> Any:
    """Turn validation errors into usage errors (2) and anything else gptrm raises into refusals (1)."""
    def wrapper(_transport: Any, args: argparse.Namespace) -> None:
        try:
            fn(args)
        except certs.ValidationError as e:
            raise CtlError(str(e), EXIT_USAGE) from None
        except GptrmError as e:
            raise CtlError(str(e), EXIT_REFUSED) from None
    return wrapper


MAX_DAYS = 36_500
"""The longest validity gptrmctl issues (100 years; X.509 dates end in 9999)."""


_days = int_between(1, MAX_DAYS, unit="days", why=" (a validity that has not already ended)")
"""The argparse type of ``--days``: a validity that has not already ended, 1 to :data:`MAX_DAYS`."""


def _queues(text: str) -> tuple[str, ...]:
    """The argparse type of ``--queues``: comma-separated queue names (checked when used)."""
    return tuple(q.strip() for q in text.split(","))


_QUEUES_HELP = ("comma-separated queues the holder may submit to, the first its default "
                "(lower-case letters, digits, '-'; at most 32); a submitter acts on these queues' tasks, a "
                "queue-admin (which must name them) also on the queues below them. Without it the credential "
                "names no queue: an admin may submit to any, a submitter to the queues whose members list it")


def _ca_create(args: argparse.Namespace) -> None:
    issued = certs.create_ca(_dir(args), common_name=args.name, days=args.days)
    print(f"CA created: {issued.cert_path} (key {issued.key_path}, mode 0600), valid until "
          f"{issued.not_after:%Y-%m-%d}")


def _issue(args: argparse.Namespace) -> None:
    issued = certs.issue(_dir(args), args.kind, args.names, out_dir=Path(args.out) if args.out else None,
                         days=args.days, queues=args.queues)
    queues = f", queues {', '.join(args.queues)}" if args.queues else ""
    print(f"{args.kind} certificate for {args.names[0]}: {issued.cert_path} (key {issued.key_path}, mode 0600), "
          f"serial {issued.serial:x}, valid until {issued.not_after:%Y-%m-%d}{queues}")


def _revoke(args: argparse.Namespace) -> None:
    crl = certs.revoke(_dir(args), Path(args.cert))
    print(f"revoked {args.cert}; CRL written to {crl} (coordinators re-read --tls-crl on SIGHUP)")


def _token(args: argparse.Namespace) -> None:
    token = tokens.new_token()
    line = tokens.token_line(args.name, args.role, token, queues=args.queues)
    print(f"token   {token}\nline    {line}\n(add the line to the coordinator's --admin-tokens file; "
          "the token is not stored anywhere)")


def add_certs_parser(subparsers: Any, parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``certs`` on gptrmctl's subparsers.

    :param subparsers: what ``ArgumentParser.add_subparsers()`` returned.
    :param parser_class: the class nested subcommand parsers use (gptrmctl's usage-error parser).
    """
    sp: argparse.ArgumentParser = subparsers.add_parser("certs", help="CA, certificates, revocation, tokens")
    sp.add_argument("--dir", help=f"CA directory (env GPTRM_PKI_DIR, default ./{DEFAULT_DIR})")
    csub = sp.add_subparsers(dest="certs_cmd", required=True, parser_class=parser_class)
    ca = csub.add_parser("ca", help="the certificate authority")
    casub = ca.add_subparsers(dest="ca_cmd", required=True, parser_class=parser_class)
    create = casub.add_parser("create", help="create the CA (ca.crt, ca.key)")
    create.add_argument("--name", default="gptrm CA", help="the CA's common name")
    create.add_argument("--days", type=_days, default=None, help=f"validity (default {certs.LIFETIME_DAYS['ca']})")
    create.set_defaults(fn=_run(_ca_create))
    iss = csub.add_parser("issue", help="issue a certificate signed by the CA")
    iss.add_argument("kind", choices=certs.KINDS)
    iss.add_argument("names", nargs="+", metavar="NAME",
                     help="node or user name; for coordinator, every host name and IP it is reached by")
    iss.add_argument("--days", type=_days, default=None,
                     help="validity (default node/coordinator 365, people's roles 90)")
    iss.add_argument("--out", help="where to write the certificate and key (default: the CA directory)")
    iss.add_argument("--queues", type=_queues, default=(), metavar="A,B", help="people's roles only: " + _QUEUES_HELP)
    iss.set_defaults(fn=_run(_issue))
    rev = csub.add_parser("revoke", help="revoke a certificate (CA-signed CRL in the CA directory)")
    rev.add_argument("cert", metavar="CERT_FILE")
    rev.set_defaults(fn=_run(_revoke))
    tok = csub.add_parser("token", help="a new bearer token and its --admin-tokens line")
    tok.add_argument("name")
    tok.add_argument("role", choices=tokens.TOKEN_ROLES)
    tok.add_argument("--queues", type=_queues, default=(), metavar="A,B", help=_QUEUES_HELP)
    tok.set_defaults(fn=_run(_token))
    return sp
